// tests/unit/test_layout.c — the two layouts of core/layout.h, with sizes
// worked out by hand (nccl-tests style: the expected values are exact).
//
// gpt2-tiny's block unit transformer.h.0 has 3280 elements over 12 tensors
// (n_embd 16: ln 16+16, c_attn 16x48 + 48, attn.c_proj 16x16 + 16, ln 16+16,
// mlp.c_fc 16x64 + 64, mlp.c_proj 64x16 + 16). At G = 3:
//  - FSDP1 pads the flat unit to 3282 (S = 1094);
//  - FSDP2 pads every tensor's rows to a multiple of 3: 16 rows become 18
//    (c = 6), 48 become 48 (c = 16), 64 become 66 (c = 22): the unit is 3582
//    elements, 14328 bytes in fp32 (docs/contract.md §5, issue 25's figure).
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "layout.h"
#include "model.h"

static fc_model tiny(void) {
    fc_model_config mc;
    fc_error e;
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &mc, &e), 0, "%s", e.msg);
    fc_model m;
    fc_model_build(&m, &mc);
    return m;
}

static const fc_layout_ops *flat(void) { return fc_layout_of(FC_LAYOUT_FLAT); }
static const fc_layout_ops *per_param(void) { return fc_layout_of(FC_LAYOUT_PER_PARAM); }

Test(layout, block_sizes_at_G3) {
    fc_model m = tiny();
    int u = 1;  // transformer.h.0
    cr_assert_eq(m.units[u].numel, 3280);
    cr_expect_eq(flat()->chunk_size(&m, u, 3) * 3, 3282);
    // per rank: 6 rows of each 16-row tensor, 16 of c_attn's 48 rows, 22 of c_proj's 64
    size_t S = 6 + 6 + 6 * 48 + 16 + 6 * 16 + 6 + 6 + 6 + 6 * 64 + 22 + 22 * 16 + 6;
    cr_expect_eq(per_param()->chunk_size(&m, u, 3), S);
    cr_expect_eq(S * 3, 3582);
    cr_expect_eq(S * 3 * sizeof(float), 14328);
    fc_model_free(&m);
}

// torch.chunk's rows: 16 rows over 3 ranks are 6, 6, 4, so the last rank's
// shard of every 16-row tensor ends in 2 rows of padding.
Test(layout, pieces_follow_torch_chunk) {
    fc_model m = tiny();
    int u = 1, G = 3;
    fc_piece pc[16];
    int n = per_param()->pieces(&m, u, G, 2, pc);
    cr_assert_eq(n, 12, "every tensor has rows on the last rank");
    // ln_1.weight: rows 12..15 at the chunk's start
    cr_expect_eq(pc[0].unit_off, 12);
    cr_expect_eq(pc[0].chunk_off, 0);
    cr_expect_eq(pc[0].count, 4);
    // ln_1.bias: its shard starts after ln_1.weight's 6 padded rows
    cr_expect_eq(pc[1].unit_off, 16 + 12);
    cr_expect_eq(pc[1].chunk_off, 6);
    cr_expect_eq(pc[1].count, 4);
    // c_attn.weight (16 x 48): rows 12..15
    cr_expect_eq(pc[2].unit_off, 32 + 12 * 48);
    cr_expect_eq(pc[2].chunk_off, 12);
    cr_expect_eq(pc[2].count, 4 * 48);
    // c_attn.bias (48 rows): 16 rows each, no padding
    cr_expect_eq(pc[3].unit_off, 32 + 768 + 32);
    cr_expect_eq(pc[3].chunk_off, 12 + 6 * 48);
    cr_expect_eq(pc[3].count, 16);
    size_t valid = 0;
    for (int j = 0; j < G; j++) {
        n = per_param()->pieces(&m, u, G, j, pc);
        for (int k = 0; k < n; k++) valid += pc[k].count;
    }
    cr_expect_eq(valid, 3280, "the pieces of all chunks tile the unit once");
    fc_model_free(&m);
}

// Short and empty trailing ranks: 16 rows over 6 ranks are c = 3 rows, so
// rank 5 holds 1; over 32 ranks c = 1 and ranks 16.. hold no row of a 16-row
// tensor (torch.chunk returns fewer chunks than ranks).
Test(layout, short_and_empty_trailing_ranks) {
    fc_model m = tiny();
    int u = 1;
    fc_piece pc[16];
    int n = per_param()->pieces(&m, u, 6, 5, pc);
    cr_assert(n > 0);
    cr_expect_eq(pc[0].count, 1, "ln_1.weight: the last of 16 rows");
    cr_expect_eq(pc[0].unit_off, 15);
    n = per_param()->pieces(&m, u, 32, 20, pc);
    // only the 48- and 64-row tensors reach rank 20, 2 rows each: c_attn.bias
    // (rows 40..41), mlp.c_fc.bias and mlp.c_proj.weight (64 rows of 16)
    cr_expect_eq(n, 3);
    cr_expect_eq(pc[0].count, 2);
    cr_expect_eq(pc[2].count, 2 * 16);
    cr_expect_eq(per_param()->owner(&m, u, 32, 15), 15, "ln_1.weight row 15 is rank 15's");
    cr_expect_eq(per_param()->owner(&m, u, 32, 32 + 12 * 48 + 47), 12, "c_attn.weight row 12");
    fc_model_free(&m);
}

// natural -> wire -> natural is the identity; the wire's padding is zero and
// every real element lands in its owner's chunk.
Test(layout, copy_in_copy_out_round_trip) {
    fc_model m = tiny();
    for (int k = 0; k < 2; k++) {
        const fc_layout_ops *lay = k ? per_param() : flat();
        for (int G = 1; G <= 8; G++) {
            for (int u = 0; u < m.n_units; u++) {
                size_t N = m.units[u].numel, S = lay->chunk_size(&m, u, G), P = S * (size_t)G;
                float *nat = malloc(N * sizeof *nat), *wire = malloc(P * sizeof *wire), *back = calloc(N, sizeof *back);
                cr_assert(nat && wire && back);
                for (size_t i = 0; i < N; i++) nat[i] = (float)(i + 1);
                fc_layout_to_wire(lay, &m, u, G, nat, wire);
                size_t nonzero = 0;
                for (size_t i = 0; i < P; i++) {
                    if (wire[i] == 0) continue;
                    nonzero++;
                    size_t x = (size_t)wire[i] - 1;  // the natural element now at wire position i
                    cr_expect_eq(lay->owner(&m, u, G, x), (int)(i / S), "%s G=%d unit %d: element %zu in chunk %zu",
                                 lay->name, G, u, x, i / S);
                }
                cr_expect_eq(nonzero, N, "%s G=%d unit %d: padding must be zero, elements once", lay->name, G, u);
                fc_layout_to_natural(lay, &m, u, G, wire, back);
                cr_expect_eq(memcmp(nat, back, N * sizeof *nat), 0, "%s G=%d unit %d", lay->name, G, u);
                free(nat), free(wire), free(back);
            }
        }
    }
    fc_model_free(&m);
}

// The flat layout's chunks are FSDP1's: fc_unit_layout_in agrees with
// fc_unit_layout_of, and per_param's own_valid sums the rank's rows.
Test(layout, unit_layout_in) {
    fc_model m = tiny();
    fc_run_config c;
    fc_run_config_defaults(&c);
    c.model = m.cfg;
    c.strategy = FC_STRATEGY_FULL_SHARD;
    for (int r = 0; r < 3; r++) {
        fc_groups g = fc_groups_of(&c, 3, r);
        fc_unit_layout a = fc_unit_layout_in(flat(), &m, 1, &g), b = fc_unit_layout_of(3280, &g);
        cr_expect_eq(memcmp(&a, &b, sizeof a), 0);
        fc_unit_layout p = fc_unit_layout_in(per_param(), &m, 1, &g);
        cr_expect_eq(p.shard, 1194);
        cr_expect_eq(p.padded, 3582);
        cr_expect_eq(p.store, 1194);
        cr_expect_eq(p.own_valid, r < 2 ? 1194 : 3280 - 2 * 1194, "rank %d", r);
    }
    c.fsdp_version = 2;
    cr_expect_eq(fc_layout_of(fc_layout_kind_of(&c)), per_param());
    cr_expect_eq(fc_backward_prefetch_of(&c), FC_PREFETCH_PRE, "FSDP2 prefetches one unit ahead in backward");
    fc_model_free(&m);
}
