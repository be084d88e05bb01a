// tests/unit/test_sweep_spec.c — a sweep case's spec (what `sweep --replay`
// and every reproduce line carry) parses back into the very case drawn:
// spec(parse(spec)) == spec, and every field the spec leaves to the CLI's
// defaults is what the draw chose. An SGD case once replayed with weight decay
// 0.01 (the CLI's default) where the sweep had drawn 0.
#include <criterion/criterion.h>

#include <string.h>

#include "../../oracle/cli.h"
#include "../../oracle/sweep_internal.h"

// Splits spec like sweep --replay does: run flags, less the sweep's --ckpt.
static int parse_spec(const char *spec, fc_run_args *ra, fc_error *e) {
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    char *args[128];
    int n = 0;
    for (char *tok = strtok(buf, " "); tok && n < 128; tok = strtok(NULL, " ")) {
        if (!strcmp(tok, "--ckpt")) {
            strtok(NULL, " ");
            continue;
        }
        args[n++] = tok;
    }
    return fc_cli_parse_run(n, args, ra, e);
}

Test(sweep_spec, every_drawn_case_replays_as_itself) {
    fc_sweep_drawer d = {.seed = 20261123, .world = 4, .fsdp_versions = FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2),
                         .features = FC_IMPL_ACT_CKPT | FC_IMPL_LLAMA | FC_IMPL_FREEZE};
    int sgd = 0, act_ckpt[3] = {0}, rf = 0, frozen[3] = {0}, lora = 0, fwd2 = 0, bwd2 = 0, gdf = 0;
    for (int i = 0; i < 5000; i++) {
        fc_run_config c;
        fc_case_ckpt k;
        int W;
        fc_sweep_draw(&d, &c, &W, &k);
        char spec[1024], again[1024];
        fc_sweep_case_spec(&c, &k, spec, sizeof spec);
        fc_run_args ra;
        fc_error e = {{0}};
        cr_assert_eq(parse_spec(spec, &ra, &e), 0, "case %d: %s: %s", i, spec, e.msg);
        fc_sweep_case_spec(&ra.cfg, &k, again, sizeof again);
        cr_assert_str_eq(again, spec, "case %d", i);
        const fc_optim_config *a = &c.optim, *b = &ra.cfg.optim;
        cr_assert(a->kind == b->kind && a->lr == b->lr && a->weight_decay == b->weight_decay &&
                      a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps && a->momentum == b->momentum &&
                      a->dampening == b->dampening && a->nesterov == b->nesterov,
                  "case %d: the optimizer replays as another: %s (weight decay %g drawn, %g replayed)", i, spec,
                  a->weight_decay, b->weight_decay);
        cr_assert(c.seed == ra.cfg.seed && c.steps == ra.cfg.steps && c.global_batch == ra.cfg.global_batch &&
                      c.grad_accum == ra.cfg.grad_accum && c.no_sync == ra.cfg.no_sync &&
                      c.strategy == ra.cfg.strategy && c.shard_group == ra.cfg.shard_group &&
                      c.param_dtype == ra.cfg.param_dtype && c.reduce_dtype == ra.cfg.reduce_dtype &&
                      c.cpu_offload == ra.cfg.cpu_offload && c.divide == ra.cfg.divide &&
                      c.backward_prefetch == ra.cfg.backward_prefetch && c.forward_prefetch == ra.cfg.forward_prefetch &&
                      c.limit_all_gathers == ra.cfg.limit_all_gathers && c.clip_grad_norm == ra.cfg.clip_grad_norm &&
                      c.norm_type == ra.cfg.norm_type && c.act_ckpt == ra.cfg.act_ckpt &&
                      c.fsdp_version == ra.cfg.fsdp_version && c.reshard_after_forward == ra.cfg.reshard_after_forward &&
                      c.backward_prefetch_depth == ra.cfg.backward_prefetch_depth &&
                      c.gradient_divide_factor == ra.cfg.gradient_divide_factor &&
                      (c.model.kind != FC_MODEL_GPT2 || c.seq_len == ra.cfg.seq_len) &&  // an MLP has no sequence
                      !strcmp(c.model.name, ra.cfg.model.name) && !strcmp(c.freeze, ra.cfg.freeze) &&
                      fc_model_config_equal(&c.model, &ra.cfg.model),
                  "case %d replays as another: %s", i, spec);
        frozen[c.model.kind] += c.freeze[0] != 0;
        lora += c.model.lora_r != 0;
        sgd += c.optim.kind == FC_OPT_SGD;
        act_ckpt[c.act_ckpt]++;
        rf += c.reshard_after_forward != 0;
        fwd2 += c.forward_prefetch > 1, bwd2 += c.backward_prefetch_depth > 1, gdf += c.gradient_divide_factor > 0;
    }
    cr_assert(fwd2 > 20 && bwd2 > 20 && gdf > 20,
              "the draw makes FSDP2 prefetch lists of 2 (forward %d, backward %d) and divide factor (%d) cases", fwd2,
              bwd2, gdf);
    cr_assert_gt(sgd, 100, "the draw makes SGD cases (%d)", sgd);
    cr_assert_gt(rf, 20, "the draw makes integer reshard_after_forward cases (%d)", rf);
    cr_assert_gt(lora, 100, "the draw makes LoRA cases (%d)", lora);
    for (int m = 0; m < 3; m++)
        cr_assert_gt(frozen[m], 100, "the draw freezes parameters of %s (%d cases)", fc_model_kind_name((fc_model_kind)m),
                     frozen[m]);
    cr_assert(act_ckpt[FC_ACT_CKPT_INSIDE] > 100 && act_ckpt[FC_ACT_CKPT_OUTSIDE] > 100,
              "the draw checkpoints activations inside (%d) and outside (%d) the unit", act_ckpt[1], act_ckpt[2]);
}

// A port without activation checkpointing (core/impl.h features) is never
// drawn a case that asks for it.
Test(sweep_spec, no_checkpointing_case_for_a_port_without_it) {
    fc_sweep_drawer d = {.seed = 7, .world = 4, .fsdp_versions = FC_IMPL_FSDP(1)};
    for (int i = 0; i < 2000; i++) {
        fc_run_config c;
        fc_case_ckpt k;
        int W;
        fc_sweep_draw(&d, &c, &W, &k);
        cr_assert_eq(c.act_ckpt, FC_ACT_CKPT_NONE, "case %d", i);
        cr_assert_eq(c.fsdp_version, 1, "case %d", i);
        cr_assert_neq(c.model.kind, FC_MODEL_LLAMA, "case %d: a port without FC_IMPL_LLAMA", i);
        cr_assert_eq(c.freeze[0], 0, "case %d: a port without FC_IMPL_FREEZE", i);
    }
}

// With a fault injected, every case drawn is one the fault applies to (its
// model: a tied head for tied_untied, rotary embeddings for rope_half; frozen
// parameters and a decay for frozen_decay; LoRA of r > 1 for lora_alpha), and
// without one, all the models are drawn.
Test(sweep_spec, a_fault_sweep_draws_only_cases_of_the_fault) {
    const unsigned all = FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2), feat = FC_IMPL_ACT_CKPT | FC_IMPL_LLAMA | FC_IMPL_FREEZE;
    fc_sweep_drawer d = {.seed = 11, .world = 4, .fsdp_versions = all, .features = feat};
    int kinds[3] = {0};
    for (int i = 0; i < 600; i++) {
        fc_run_config c;
        fc_case_ckpt k;
        int W;
        d.inject = FC_FAULT_ROPE_HALF;
        fc_sweep_draw(&d, &c, &W, &k);
        cr_assert_eq(c.model.kind, FC_MODEL_LLAMA, "rope_half case %d: %s", i, c.model.name);
        cr_assert_eq(c.inject, FC_FAULT_NONE);
        d.inject = FC_FAULT_TIED_UNTIED;
        fc_sweep_draw(&d, &c, &W, &k);
        cr_assert(fc_model_tied(&c.model), "tied_untied case %d: %s", i, c.model.name);
        d.inject = FC_FAULT_FROZEN_DECAY;
        fc_sweep_draw(&d, &c, &W, &k);
        cr_assert((c.freeze[0] || c.model.lora_r) && c.optim.weight_decay > 0, "frozen_decay case %d: '%s', decay %g",
                  i, c.freeze, c.optim.weight_decay);
        d.inject = FC_FAULT_LORA_ALPHA;
        fc_sweep_draw(&d, &c, &W, &k);
        cr_assert(c.model.lora_r > 1, "lora_alpha case %d: %s", i, c.model.name);
        d.inject = FC_FAULT_NONE;
        fc_sweep_draw(&d, &c, &W, &k);
        kinds[c.model.kind]++;
    }
    cr_expect(kinds[FC_MODEL_MLP] > 100 && kinds[FC_MODEL_GPT2] > 100 && kinds[FC_MODEL_LLAMA] > 100,
              "mlp %d, gpt2 %d, llama %d", kinds[0], kinds[1], kinds[2]);
}
