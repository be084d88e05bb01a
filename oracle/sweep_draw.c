// oracle/sweep_draw.c — the sweep's cases: seeded random draws from the
// config space (model, world size W' <= W, strategy and shard group, FSDP1
// or FSDP2 (one sharded case in four),
// prefetch and the limiter, mixed precision, the divide mode, accumulation
// with or without no_sync, clipping, offload, the optimizer, and for one case
// in five a checkpoint round trip loaded at another W and strategy), and each
// case as replayable `run` flags.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sweep_internal.h"

double fc_sweep_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int pick(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

void fc_sweep_set_model(fc_run_config *c, const char *name) {
    fc_error e;
    if (fc_model_config_load(name, &c->model, &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
}

void fc_sweep_set_batch(fc_run_config *c, int W, int m) { c->global_batch = W * c->grad_accum * m; }

int fc_sweep_draw_starved(const fc_sweep_drawer *d, char *msg, size_t cap) {
    for (int i = 0; i < FC_STRATEGY_COUNT; i++)
        if (d->drawn[i] >= FC_SWEEP_STARVED_DRAWS && d->kept[i] == 0) {
            snprintf(msg, cap, "the config validator refused all %ld draws of strategy %s, so the sweep never tested it",
                     d->drawn[i], fc_strategy_name((fc_strategy)i));
            return 1;
        }
    return 0;
}

// The strategy (FSDP1's prefetch and limiter with it) and a hybrid's shard group.
static void draw_strategy(fc_sweep_drawer *d, fc_run_config *c, int W) {
    uint64_t *s = &d->seed;
    const fc_strategy strategies[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_FULL_SHARD,
                                      FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_HYBRID_SHARD,
                                      FC_STRATEGY_HYBRID_SHARD_ZERO2};
    int fsdp1 = (d->fsdp_versions & FC_IMPL_FSDP(1)) != 0;
    c->strategy = strategies[pick(s, 6)];
    if (!fsdp1 && c->strategy == FC_STRATEGY_NO_SHARD) c->strategy = FC_STRATEGY_FULL_SHARD;  // FSDP2 has none
    d->drawn[c->strategy]++;
    int hybrid = c->strategy == FC_STRATEGY_HYBRID_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2;
    if (hybrid) {  // a proper divisor when there is one, so replicas exist
        int divs[8], n = 0;
        for (int F = 1; F < W; F++)
            if (W % F == 0) divs[n++] = F;
        c->shard_group = n ? divs[pick(s, n)] : W;
    }
    if (c->strategy != FC_STRATEGY_NO_SHARD) {
        c->backward_prefetch = (fc_prefetch)pick(s, 3);
        c->forward_prefetch = pick(s, 3) == 0;
        c->limit_all_gathers = (c->forward_prefetch || c->backward_prefetch) && pick(s, 3) == 0;
    }
}

// FSDP2, per-parameter rows: one sharded case in four, or all where only FSDP2 applies (an FSDP2 fault).
static void draw_fsdp2(fc_sweep_drawer *d, fc_run_config *c, int W) {
    uint64_t *s = &d->seed;
    int fsdp1 = (d->fsdp_versions & FC_IMPL_FSDP(1)) != 0, fsdp2 = (d->fsdp_versions & FC_IMPL_FSDP(2)) != 0;
    if (!(fsdp2 && c->strategy != FC_STRATEGY_NO_SHARD && (!fsdp1 || pick(s, 4) == 0))) return;
    c->fsdp_version = 2;
    c->backward_prefetch = FC_PREFETCH_NONE;  // its own: one unit ahead in backward, no limiter
    c->limit_all_gathers = 0;                 // forward_prefetch stays: an explicit forward list
    // an integer reshard_after_forward, where the shard group has a divisor between 1 and F
    int F = c->shard_group ? c->shard_group : W, R = 0;
    for (int q = 2; q < F && !R; q++)
        if (F % q == 0) R = q;
    int frees = c->strategy == FC_STRATEGY_FULL_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD;
    if (R && frees && pick(s, 2)) c->reshard_after_forward = R;
    // explicit prefetch lists of two units (set_modules_to_*_prefetch), and
    // set_gradient_divide_factor F other than W (2W, or 1 at W > 1): the
    // gradient W / F times the mean, which local and the round trip follow
    if (c->forward_prefetch && pick(s, 2)) c->forward_prefetch = 2;
    if (pick(s, 3) == 0) c->backward_prefetch_depth = 2;
    if (pick(s, 4) == 0) c->gradient_divide_factor = W > 1 && pick(s, 2) ? 1 : 2.0 * W;
}

// Accumulation, clipping, precision, offload, the divide mode, the optimizer, the steps and the batch.
static void draw_training(fc_sweep_drawer *d, fc_run_config *c, int W) {
    uint64_t *s = &d->seed;
    c->grad_accum = pick(s, 3) == 0 ? 2 : 1;
    c->no_sync = c->grad_accum > 1 && pick(s, 2);
    if (pick(s, 4) == 0) {
        c->norm_type = (fc_norm_type)pick(s, 3);
        c->clip_grad_norm = c->norm_type == FC_NORM_1 ? 0.5f : 0.05f;  // below typical norms: it clips
    }
    int mp = pick(s, 5);
    if (mp == 0) c->param_dtype = FC_PREC_BF16, c->reduce_dtype = FC_PREC_FP32;
    if (mp == 1) c->param_dtype = c->reduce_dtype = pick(s, 2) ? FC_PREC_BF16 : FC_PREC_FP16;
    c->cpu_offload = pick(s, 6) == 0;
    // the divide modes are one average with different roundings (docs/contract.md §4)
    c->divide = fc_default_divide(c);
    if (W > 1 && pick(s, 4) == 0) c->divide = pick(s, 2) ? FC_DIVIDE_AVG : FC_DIVIDE_SUM_THEN_DIVIDE;
    if (pick(s, 4) == 0) {
        c->optim.kind = FC_OPT_SGD;
        c->optim.lr = 0.05;
        c->optim.weight_decay = 0.0;
    }
    c->steps = 2;
    c->seq_len = 8;
    c->seed = rng_next(s) % 1000000;
    fc_sweep_set_batch(c, W, 1 + pick(s, 2));
}

// A checkpoint round trip, loaded at another W and strategy (FSDP2's sharded
// one is DCP's, and loads into FSDP1 where no_shard is drawn).
static void draw_round_trip(fc_sweep_drawer *d, fc_run_config *c, fc_case_ckpt *k) {
    uint64_t *s = &d->seed;
    if (pick(s, 5) != 0) return;
    const fc_strategy load[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
    c->steps = 3;
    k->on = 1;
    k->sharded = pick(s, 2);
    k->at = 1 + pick(s, 2);
    k->strategy = load[pick(s, 3)];
    do k->W = 1 + pick(s, d->world);
    while (c->global_batch % (k->W * c->grad_accum) != 0);
}

// Activation checkpointing, frozen parameters and LoRA, where the implementation has them.
static void draw_features(fc_sweep_drawer *d, fc_run_config *c) {
    uint64_t *s = &d->seed;
    unsigned features = d->features;
    // activation checkpointing, inside or outside the unit (P15, and P10's recompute events)
    if ((features & FC_IMPL_ACT_CKPT) && pick(s, 5) == 0)
        c->act_ckpt = pick(s, 2) ? FC_ACT_CKPT_INSIDE : FC_ACT_CKPT_OUTSIDE;
    // frozen parameters beside trainable ones in a unit (FSDP1 use_orig_params, FSDP2): the
    // embedding, a part of every unit, or every parameter of one unit (the root's, layers.0):
    // a unit that reduces nothing. No pattern has a '|' or a space: repro lines stay shell-safe.
    // LoRA (r 2, alpha 4) on llama's attention or on every linear: the base model frozen
    if ((features & FC_IMPL_FREEZE) && c->model.kind == FC_MODEL_LLAMA && pick(s, 4) == 0) {
        fc_error le;
        if (fc_model_config_set_lora(&c->model, pick(s, 2) ? "2:4:[qv]_proj" : "2:4:proj", &le))
            fc_die(FC_EXIT_INTERNAL, "%s:%d: %s", __FILE__, __LINE__, le.msg);
    } else if ((features & FC_IMPL_FREEZE) && pick(s, 5) == 0) {
        static const char *freeze[3][3] = {{"bias", "weight", "layers[.]0[.]"},
                                           {"wte", "ln_", "transformer[.][wl][tpn]"},
                                           {"embed_tokens", "proj", "^model[.][en]"}};
        snprintf(c->freeze, sizeof c->freeze, "%s", freeze[c->model.kind][pick(s, 3)]);
    }
}

void fc_sweep_draw(fc_sweep_drawer *d, fc_run_config *c, int *W, fc_case_ckpt *k) {
    for (;;) {
        memset(k, 0, sizeof *k);
        fc_run_config_defaults(c);
        *W = 1 + pick(&d->seed, d->world);
        // llama's two (GQA; untied and tied heads) only for an implementation that has the model
        const char *models[] = {"mlp-tiny", "gpt2-tiny", "gpt2-tiny", "mlp-micro", "llama-tiny", "llama-micro"};
        fc_sweep_set_model(c, models[pick(&d->seed, d->features & FC_IMPL_LLAMA ? 6 : 4)]);
        draw_strategy(d, c, *W);
        draw_fsdp2(d, c, *W);
        draw_training(d, c, *W);
        draw_round_trip(d, c, k);
        draw_features(d, c);
        fc_error e;
        fc_run_config run = *c;  // as the case will run: with the fault, which may not apply to it
        run.inject = d->inject;
        if (fc_run_config_validate(&run, &e) == 0 && fc_run_config_validate_world(&run, *W, &e) == 0) {
            d->kept[c->strategy]++;
            return;
        }
    }
}

void fc_sweep_case_spec(const fc_run_config *c, const fc_case_ckpt *k, char *out, size_t cap) {
    size_t n = 0;
#define ADD(...) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__)
    ADD("--model %s --strategy %s", c->model.name, fc_strategy_name(c->strategy));
    if (c->fsdp_version != 1) ADD(" --fsdp-version %d", c->fsdp_version);
    if (c->reshard_after_forward) ADD(" --reshard-after-forward %d", c->reshard_after_forward);
    if (c->shard_group) ADD(" --shard-group %d", c->shard_group);
    if (c->backward_prefetch != FC_PREFETCH_NONE) ADD(" --backward-prefetch %s", fc_prefetch_name(c->backward_prefetch));
    if (c->forward_prefetch == 1) ADD(" --forward-prefetch");
    if (c->forward_prefetch > 1) ADD(" --forward-prefetch-units %d", c->forward_prefetch);
    if (c->backward_prefetch_depth) ADD(" --backward-prefetch-units %d", c->backward_prefetch_depth);
    if (c->gradient_divide_factor > 0) ADD(" --gradient-divide-factor %.17g", c->gradient_divide_factor);
    if (c->limit_all_gathers) ADD(" --limit-all-gathers");
    if (c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32)
        ADD(" --param-dtype %s --reduce-dtype %s", fc_prec_name(c->param_dtype), fc_prec_name(c->reduce_dtype));
    if (c->grad_accum > 1) ADD(" --grad-accum %d", c->grad_accum);
    if (c->no_sync) ADD(" --no-sync");
    if (c->clip_grad_norm > 0) ADD(" --clip-grad-norm %g --norm-type %s", (double)c->clip_grad_norm, fc_norm_name(c->norm_type));
    if (c->cpu_offload) ADD(" --cpu-offload");
    if (c->act_ckpt != FC_ACT_CKPT_NONE) ADD(" --activation-checkpointing %s", fc_act_ckpt_name(c->act_ckpt));
    if (c->freeze[0]) ADD(" --freeze %s", c->freeze);
    if (c->model.lora_r) ADD(" --lora %d:%g:%s", c->model.lora_r, c->model.lora_alpha, c->model.lora_target);
    if (c->divide != fc_default_divide(c)) ADD(" --divide %s", fc_divide_name(c->divide));
    ADD(" --optimizer %s --lr %g", fc_opt_name(c->optim.kind), c->optim.lr);
    // always: the CLI's default (0.01) is not the sweep's SGD (0), and a replay must be the case
    ADD(" --weight-decay %g", c->optim.weight_decay);
    ADD(" --steps %d --global-batch %d", c->steps, c->global_batch);
    if (fc_model_has_tokens(&c->model)) ADD(" --seq-len %d", c->seq_len);
    ADD(" --seed %llu", (unsigned long long)c->seed);
    // sweep's own flag: save after AT steps, load at W2 with STRATEGY, continue
    if (k->on) ADD(" --ckpt %s:%d:%d:%s", k->sharded ? "sharded" : "full", k->at, k->W, fc_strategy_name(k->strategy));
#undef ADD
}

