// tests/unit/test_rules.c — the oracle's own statement of FSDP's rules
// (oracle/rules.h) against exact values worked out by hand from docs/contract.md §5 and
// PyTorch, and against core/layout.c for every strategy, model, W and rank the
// sweep draws (the two writings must agree; a disagreement is named).
#include <criterion/criterion.h>

#include <stdio.h>

#include "layout.h"
#include "rules.h"

static void build_gpt2_tiny(fc_model *m) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_error e;
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &c.model, &e), 0);
    fc_model_build(m, &c.model);
}

// PyTorch FSDP1's _get_gradient_predivide_factor, as its source writes it
static int torch_predivide(int W) {
    int f = 1;
    while (W % f == 0 && W / f > f) f *= 2;
    return f;
}

Test(rules, prepost_closed_form_is_pytorchs_loop) {
    for (int W = 1; W <= 1024; W++) {
        double pre, post;
        fc_rule_divide(FC_DIVIDE_PREPOST, W, &pre, &post);
        cr_assert_eq((int)pre, torch_predivide(W), "W=%d: closed form %g, PyTorch's loop %d", W, pre, torch_predivide(W));
        cr_assert_eq(pre * post, (double)W, "W=%d: pre * post = %g", W, pre * post);
    }
    // worked by hand: W=3 -> 2 and 1.5 (2 does not divide 3); W=6 -> 4 and 1.5; W=16 -> 4 and 4
    double pre, post;
    fc_rule_divide(FC_DIVIDE_PREPOST, 3, &pre, &post);
    cr_assert(pre == 2 && post == 1.5);
    fc_rule_divide(FC_DIVIDE_PREPOST, 6, &pre, &post);
    cr_assert(pre == 4 && post == 1.5);
    fc_rule_divide(FC_DIVIDE_PREPOST, 16, &pre, &post);
    cr_assert(pre == 4 && post == 4);
    fc_rule_divide(FC_DIVIDE_AVG, 8, &pre, &post);
    cr_assert(pre == 8 && post == 1);
    fc_rule_divide(FC_DIVIDE_SUM_THEN_DIVIDE, 8, &pre, &post);
    cr_assert(pre == 1 && post == 8);
}

Test(rules, strategy_table_is_design_5) {
    // strategy: gathers, frees after forward, hybrid
    const int want[][4] = {{FC_STRATEGY_NO_SHARD, 0, 0, 0},        {FC_STRATEGY_FULL_SHARD, 1, 1, 0},
                           {FC_STRATEGY_SHARD_GRAD_OP, 1, 0, 0},   {FC_STRATEGY_HYBRID_SHARD, 1, 1, 1},
                           {FC_STRATEGY_HYBRID_SHARD_ZERO2, 1, 0, 1}};
    for (int i = 0; i < 5; i++) {
        const fc_rule_row *r = fc_rule_row_of((fc_strategy)want[i][0]);
        cr_assert(r->gathers == want[i][1] && r->frees_after_fwd == want[i][2] && r->hybrid == want[i][3],
                  "%s", fc_strategy_name((fc_strategy)want[i][0]));
    }
}

Test(rules, layout_by_hand) {
    // 10 elements over G = 4: S = 3, P = 12; chunk 3 holds element 9 and 2 of padding
    fc_groups g = {.W = 4, .rank = 3, .sharded = 1, .F = 4, .R = 1, .shard_rank = 3, .G = 4, .idx = 3};
    fc_unit_layout l = fc_rule_layout(10, &g);
    cr_assert(l.shard == 3 && l.padded == 12 && l.own_off == 9 && l.own_valid == 1 && l.store == 3);
    // 4 elements over G = 8: chunk 5 is all padding
    fc_groups h = {.W = 8, .rank = 5, .sharded = 1, .F = 8, .R = 1, .shard_rank = 5, .G = 8, .idx = 5};
    l = fc_rule_layout(4, &h);
    cr_assert(l.shard == 1 && l.padded == 8 && l.own_off == 5 && l.own_valid == 0);
    // hybrid_shard at W = 6 with groups of 3: rank 4 is position 1 of group 1
    fc_run_config c;
    fc_run_config_defaults(&c);
    c.strategy = FC_STRATEGY_HYBRID_SHARD;
    c.shard_group = 3;
    fc_groups k = fc_rule_groups(&c, 6, 4);
    cr_assert(k.F == 3 && k.R == 2 && k.shard_rank == 1 && k.replica == 1 && k.G == 3 && k.idx == 1);
}

Test(rules, prefetch_opportunities_by_hand) {
    // gpt2-tiny: stages embed(root) block0 block1 head(root): units in first
    // forward use root, 1, 2; backward reaches 2 at stage 2, then 1, then root
    fc_model m;
    build_gpt2_tiny(&m);
    int fwd[8], bwd[8];
    cr_assert(m.n_units <= 8);
    fc_rule_opportunities(&m, 1, 1, fwd, bwd);
    for (int u = 0; u < m.n_units; u++) {
        fc_unit_stages st = fc_rule_stages(&m, u);
        printf("unit %d: stages fwd %d..%d, prefetched in forward at %d, in backward at %d\n", u, st.first_fwd,
               st.last_fwd, fwd[u], bwd[u]);
    }
    int root = m.root_unit;
    cr_assert_eq(fwd[root], -1, "the first unit in forward has no opportunity");
    fc_unit_stages rs = fc_rule_stages(&m, root);
    cr_assert(rs.first_fwd == 0 && rs.last_fwd == m.n_stages - 1, "the root is used first and last");
    cr_assert_eq(bwd[root], -1, "the root is where backward starts");
    // by hand: units root=0, block0=1, block1=2 over stages 0..3 (embed, block0,
    // block1, head): forward prefetches block0 at the embedding (0) and block1
    // at block0 (1); backward reaches the head (3) first and prefetches block1
    // there, then block0 at block1 (2)
    cr_assert(root == 0 && m.n_units == 3 && m.n_stages == 4);
    cr_assert(fwd[1] == 0 && fwd[2] == 1 && bwd[2] == 3 && bwd[1] == 2);
    // FSDP2's lists of 2 (and of 3: no third unit to name): the root names
    // both blocks in its pre-forward (0) and in its pre-backward (3)
    for (int d = 2; d <= 3; d++) {
        fc_rule_opportunities(&m, d, d, fwd, bwd);
        cr_assert(fwd[root] == -1 && bwd[root] == -1);
        cr_assert(fwd[1] == 0 && fwd[2] == 0 && bwd[2] == 3 && bwd[1] == 3, "lists of %d", d);
    }
    // forward lists of 2, backward one ahead
    fc_rule_opportunities(&m, 2, 1, fwd, bwd);
    cr_assert(fwd[1] == 0 && fwd[2] == 0 && bwd[2] == 3 && bwd[1] == 2);
    fc_model_free(&m);
}

Test(rules, core_layout_agrees_everywhere_the_sweep_goes) {
    const char *models[] = {"mlp-micro", "mlp-tiny", "gpt2-tiny"};
    const fc_strategy strategies[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP,
                                      FC_STRATEGY_HYBRID_SHARD, FC_STRATEGY_HYBRID_SHARD_ZERO2};
    int checked = 0;
    for (int mi = 0; mi < 3; mi++)
        for (int si = 0; si < 5; si++)
            for (int W = 1; W <= 8; W++)
                for (int F = 1; F <= W; F++) {
                    int hybrid = si >= 3;
                    if ((hybrid && W % F) || (!hybrid && F > 1)) continue;
                    for (int lim = 0; lim < 2; lim++) {
                        fc_run_config c;
                        fc_run_config_defaults(&c);
                        fc_error e;
                        cr_assert_eq(fc_model_config_load(models[mi], &c.model, &e), 0);
                        c.strategy = strategies[si];
                        c.shard_group = hybrid ? F : 0;
                        c.limit_all_gathers = lim;
                        c.global_batch = 8 * W;
                        for (int r = 0; r < W; r++) {
                            fc_findings f = {0};
                            int n = fc_rules_disagree(&c, W, r, &f);
                            cr_assert_eq(n, 0, "%s %s W=%d F=%d rank %d: %s", models[mi],
                                         fc_strategy_name(c.strategy), W, F, r, f.n_kept ? f.msg[0] : "");
                            checked++;
                        }
                    }
                }
    cr_assert_gt(checked, 500);
}

Test(rules, fsdp2_per_parameter_shards_by_hand) {
    // gpt2-tiny (C=16, V=97, P=32): FSDP2 pads each parameter's rows to a
    // multiple of F. Block 0 at F=3 (issue 25's example): c_attn.weight 16x48
    // becomes 18x48, and the unit 3582 elements, not FSDP1's 3282 (3280 flat,
    // padded). Rows per parameter, by hand: ln_1 w,b 16 -> 18 (x1 each);
    // c_attn w 16x48 -> 18x48, b 48 -> 48; attn c_proj w 16x16 -> 18x16, b 16
    // -> 18; ln_2 w,b 16 -> 18; mlp c_fc w 16x64 -> 18x64, b 64 -> 66; mlp
    // c_proj w 64x16 -> 66x16, b 16 -> 18.
    fc_model m;
    build_gpt2_tiny(&m);
    size_t block = 18 + 18 + 18 * 48 + 48 + 18 * 16 + 18 + 18 + 18 + 18 * 64 + 66 + 66 * 16 + 18;
    cr_assert_eq(block, 3582);
    cr_assert_eq(fc_rule_fsdp2_shard(&m, 1, 3) * 3, block, "FSDP2 block 0 at F=3: %zu elements",
                 fc_rule_fsdp2_shard(&m, 1, 3) * 3);
    // the root at F=2: wte 97x16 -> 98x16, wpe 32x16, ln_f 16 + 16: 8448 bytes gathered, as real FSDP2 sent
    cr_assert_eq(fc_rule_fsdp2_shard(&m, 0, 2) * 2 * 4, 8448);
    // F=1: no padding, the unit's own size
    for (int u = 0; u < m.n_units; u++) cr_assert_eq(fc_rule_fsdp2_shard(&m, u, 1), m.units[u].numel);
    fc_model_free(&m);
}
