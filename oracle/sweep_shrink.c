// oracle/sweep_shrink.c — shrinking a failing case: simpler variants (a
// smaller world, no clipping, no accumulation, no offload, no activation
// checkpointing, no prefetch or prefetch lists, no divide factor, fp32,
// fewer layers and smaller dims, fewer steps, the default optimizer and divide
// mode, no checkpoint round trip) are kept while they still fail, so the
// reproducer a user gets is the smallest this finds.
#include <stdio.h>
#include <string.h>

#include "sweep_internal.h"

// Simplification 0: a smaller world, down to 2 (faults that need peers), then 1.
static int smaller_world(fc_run_config *c, int *W) {
    if (*W <= 1) return 0;
    // FSDP2's divide factor keeps its ratio to the world (the same multiple of the mean)
    if (c->gradient_divide_factor > 0) c->gradient_divide_factor *= (double)(*W > 2 ? *W - 1 : 1) / *W;
    *W = *W > 2 ? *W - 1 : 1;
    c->reshard_after_forward = 0;  // it divides the old shard group only
    if (c->shard_group && *W % c->shard_group) c->shard_group = 0;
    if (c->shard_group == *W) c->shard_group = 0;
    if (*W == 1) c->divide = FC_DIVIDE_PREPOST;  // one rank divides nothing
    return 1;
}

// Simplifications 10 and 11: fewer layers and smaller dims (the same LoRA), an MLP.
static int smaller_model(int k, fc_run_config *c) {
    if (k == 11) {
        if (fc_model_has_tokens(&c->model)) return 0;  // some faults live in the tied embedding or the sequence
        if (!strcmp(c->model.name, "mlp-micro")) return 0;
        fc_sweep_set_model(c, "mlp-micro");
        return 1;
    }
    fc_model_config was = c->model;
    if (!strcmp(c->model.name, "gpt2-tiny")) fc_sweep_set_model(c, "gpt2-micro");
    else if (!strcmp(c->model.name, "mlp-tiny")) fc_sweep_set_model(c, "mlp-micro");
    else if (!strcmp(c->model.name, "llama-tiny")) fc_sweep_set_model(c, "llama-micro");
    else return 0;
    c->model.lora_r = was.lora_r, c->model.lora_alpha = was.lora_alpha;
    memcpy(c->model.lora_target, was.lora_target, sizeof c->model.lora_target);
    return 1;
}

// Simplification 16: the checkpoint round trip at the case's own world size, then none.
static int simpler_round_trip(fc_run_config *c, int W, fc_case_ckpt *ck) {
    if (!ck->on) return 0;
    if (ck->W != W) {
        ck->W = W;
    } else {
        ck->on = 0;
        c->steps = 2;
    }
    return 1;
}

// Turns a switch off: 0 if it was off already (nothing simpler), else 1.
static int cleared(int *f) {
    if (!*f) return 0;
    *f = 0;
    return 1;
}

// Simplifications of the schedule: no clipping, accumulation, no_sync,
// offload, limiter, prefetch, integer reshard_after_forward or divide factor.
static int drop_schedule_option(int k, fc_run_config *c) {
    switch (k) {
    case 1:
        if (c->clip_grad_norm == 0) return 0;
        c->clip_grad_norm = 0, c->norm_type = FC_NORM_2;
        return 1;
    case 2:
        if (c->grad_accum == 1) return 0;
        c->grad_accum = 1, c->no_sync = 0;
        return 1;
    case 3: return cleared(&c->no_sync);
    case 4: return cleared(&c->cpu_offload);
    case 5: return cleared(&c->limit_all_gathers);
    case 6: return cleared(&c->forward_prefetch);
    case 7:
        if (c->backward_prefetch == FC_PREFETCH_NONE) return 0;
        c->backward_prefetch = FC_PREFETCH_NONE;
        c->limit_all_gathers = c->limit_all_gathers && c->forward_prefetch;
        return 1;
    case 19: return cleared(&c->reshard_after_forward);
    case 22: return cleared(&c->backward_prefetch_depth);
    case 23:
        if (c->gradient_divide_factor == 0) return 0;
        c->gradient_divide_factor = 0;
        return 1;
    default:
        return 0;
    }
}

// Simplifications of the rest: fp32, full_shard, fewer steps, a shorter
// sequence, the default optimizer and divide mode, no activation
// checkpointing, freezing or LoRA.
static int simpler_setting(int k, fc_run_config *c) {
    switch (k) {
    case 8:
        if (c->param_dtype == FC_PREC_FP32 && c->reduce_dtype == FC_PREC_FP32) return 0;
        c->param_dtype = c->reduce_dtype = FC_PREC_FP32;
        return 1;
    case 9:
        if (c->strategy != FC_STRATEGY_HYBRID_SHARD_ZERO2 && c->strategy != FC_STRATEGY_SHARD_GRAD_OP) return 0;
        c->strategy = c->strategy == FC_STRATEGY_SHARD_GRAD_OP ? FC_STRATEGY_FULL_SHARD : FC_STRATEGY_HYBRID_SHARD;
        return 1;
    case 12:
        if (c->steps <= 1) return 0;
        c->steps--;
        return 1;
    case 13:
        if (!fc_model_has_tokens(&c->model) || c->seq_len <= 2) return 0;
        c->seq_len /= 2;
        return 1;
    case 14: {
        if (c->optim.kind == FC_OPT_ADAMW) return 0;
        fc_run_config d;
        fc_run_config_defaults(&d);
        c->optim = d.optim;
        return 1;
    }
    case 17:
        if (c->divide == FC_DIVIDE_PREPOST) return 0;
        c->divide = FC_DIVIDE_PREPOST;
        return 1;
    case 18:
        if (c->act_ckpt == FC_ACT_CKPT_NONE) return 0;
        c->act_ckpt = FC_ACT_CKPT_NONE;
        return 1;
    case 20:
        if (!c->freeze[0]) return 0;
        c->freeze[0] = '\0';
        return 1;
    case 21:
        if (!c->model.lora_r) return 0;
        c->model.lora_r = 0;
        c->model.lora_alpha = 0;
        c->model.lora_target[0] = '\0';
        return 1;
    default:
        return 0;
    }
}

// Applies simplification k to (c, W); returns 0 if it does not apply.
static int simplify(int k, fc_run_config *c, int *W, fc_case_ckpt *ck) {
    int m = c->global_batch / (*W * c->grad_accum);  // samples per micro-batch
    int applies;
    if (k == 0) applies = smaller_world(c, W);
    else if (k == 10 || k == 11) applies = smaller_model(k, c);
    else if (k == 15) {  // one sample per micro-batch
        applies = m > 1;
        m = 1;
    }
    else if (k == 16) applies = simpler_round_trip(c, *W, ck);
    else applies = drop_schedule_option(k, c) || simpler_setting(k, c);
    if (!applies) return 0;
    fc_sweep_set_batch(c, *W, m);
    fc_error e;
    return fc_run_config_validate(c, &e) == 0 && fc_run_config_validate_world(c, *W, &e) == 0;
}

int fc_sweep_simplify(int k, fc_run_config *c, int *W, fc_case_ckpt *ck) {
    if (k < 0 || k >= FC_SWEEP_N_SIMPLIFY || !simplify(k, c, W, ck)) return 0;
    return !(ck->on && (ck->at >= c->steps || c->global_batch % (ck->W * c->grad_accum)));
}

void fc_sweep_shrink(const fc_sweep_ctx *x, fc_case_result *worst, int quiet) {
    fc_run_config c = worst->cfg;
    fc_case_ckpt ck = worst->ckpt;
    int W = worst->W, tries = 0;
    for (int progress = 1; progress && tries < 60;) {
        progress = 0;
        for (int k = 0; k < FC_SWEEP_N_SIMPLIFY && tries < 60; k++) {
            fc_run_config c2 = c;
            fc_case_ckpt ck2 = ck;
            int W2 = W;
            if (!fc_sweep_simplify(k, &c2, &W2, &ck2)) continue;
            fc_case_result r;
            fc_sweep_run_case(x, &c2, W2, &ck2, &r);
            tries++;
            // a variant counts while it still fails, and, for an injected fault,
            // while it still fails the property the catalogue expects to catch it
            if (x->expect ? (r.v.failed >> x->expect) & 1 : r.v.failed != 0) {
                c = c2, ck = ck2, W = W2, *worst = r, progress = 1;
                if (!quiet && x->rank == 0) fprintf(stderr, "  shrunk (W=%d): %s\n", W, r.spec);
            }
        }
    }
}

