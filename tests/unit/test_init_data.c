// tests/unit/test_init_data.c — counter-based init and data (docs/contract.md §3).
//
// The contract: initial weights are a pure function of (seed, name, index) and
// the data a pure function of (seed, step, sample), so whatever slice a rank
// asks for — any sub-range of a parameter, any FSDP shard, any data-parallel
// range of samples — it gets exactly the bits of the same slice of the whole.
// Also: Philox4x32-10 against the Random123 known-answer vectors, and the init
// distributions against Hugging Face's (normal 0.02, c_proj 0.02/sqrt(2L),
// LayerNorm 1/0, zero biases) and nn.Linear's (U(-1/sqrt(in), 1/sqrt(in))).
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "data.h"
#include "init.h"
#include "model.h"
#include "rng.h"

static void load_model(const char *preset, fc_model *m) {
    fc_model_config cfg;
    fc_error e;
    cr_assert_eq(fc_model_config_load(preset, &cfg, &e), 0, "%s: %s", preset, e.msg);
    fc_model_build(m, &cfg);
}

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

// ---------------------------------------------------------------------------
// Philox4x32-10 known answers (Random123 kat_vectors, philox4x32 10 rounds).
// fc_philox(key, ctr_hi, ctr_lo): ctr_lo = c0 | c1 << 32, ctr_hi = c2 | c3 << 32,
// key = k0 | k1 << 32.

static void kat(const uint32_t c[4], const uint32_t k[2], const uint32_t want[4]) {
    uint64_t lo = (uint64_t)c[0] | (uint64_t)c[1] << 32;
    uint64_t hi = (uint64_t)c[2] | (uint64_t)c[3] << 32;
    uint64_t key = (uint64_t)k[0] | (uint64_t)k[1] << 32;
    fc_u32x4 r = fc_philox(key, hi, lo);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(r.v[i], want[i], "ctr %08x %08x %08x %08x key %08x %08x: word %d = %08x, want %08x",
                     c[0], c[1], c[2], c[3], k[0], k[1], i, r.v[i], want[i]);
}

Test(philox, kat_zero) {
    const uint32_t c[4] = {0, 0, 0, 0}, k[2] = {0, 0};
    const uint32_t want[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    kat(c, k, want);
}

Test(philox, kat_all_ones) {
    const uint32_t c[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
    const uint32_t k[2] = {0xffffffff, 0xffffffff};
    const uint32_t want[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    kat(c, k, want);
}

Test(philox, kat_pi_digits) {
    const uint32_t c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t k[2] = {0xa4093822, 0x299f31d0};
    const uint32_t want[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    kat(c, k, want);
}

Test(philox, u01_range) {
    cr_expect_eq(fc_u01(0), 0.0f);
    cr_expect_eq(fc_u01(0xffffffffu), 16777215.0f / 16777216.0f);
    cr_expect_lt(fc_u01(0xffffffffu), 1.0f);
    cr_expect_eq(fc_u01(0x80000000u), 0.5f);
    cr_expect_eq(fc_u01(0x000000ffu), 0.0f, "only the top 24 bits count");
}

Test(philox, hash_distinguishes_names) {
    cr_expect_neq(fc_hash_str("transformer.h.0.attn.c_attn.weight"),
                  fc_hash_str("transformer.h.1.attn.c_attn.weight"));
    cr_expect_neq(fc_hash_str("a"), fc_hash_str("b"));
    cr_expect_neq(fc_hash_str(""), fc_hash_str("a"));
    cr_expect_eq(fc_hash_str("layers.0.weight"), fc_hash_str("layers.0.weight"));
}

// ---------------------------------------------------------------------------
// init: any slice gives the bits of the same slice of the whole

// Splits every parameter of a model into W = 1..8 contiguous, uneven
// (randomly cut, some empty) shards, initialises each on its own and checks
// the concatenation equals the full range bitwise.
static void check_param_splits(const char *preset, uint64_t seed) {
    fc_model m;
    load_model(preset, &m);
    uint32_t s = 99;
    for (int pi = 0; pi < m.n_params; pi++) {
        const fc_param *p = &m.params[pi];
        float *full = malloc(p->numel * sizeof(float));
        float *part = malloc(p->numel * sizeof(float));
        fc_init_range(p, seed, 0, p->numel, full);
        for (int W = 1; W <= 8; W++) {
            size_t cut[9];
            cut[0] = 0;
            cut[W] = p->numel;
            for (int r = 1; r < W; r++) cut[r] = lcg(&s) % (p->numel + 1);
            // sort the inner cuts
            for (int a = 1; a < W; a++)
                for (int b = a + 1; b < W; b++)
                    if (cut[b] < cut[a]) {
                        size_t t = cut[a];
                        cut[a] = cut[b];
                        cut[b] = t;
                    }
            memset(part, 0xAB, p->numel * sizeof(float));
            for (int r = 0; r < W; r++) fc_init_range(p, seed, cut[r], cut[r + 1] - cut[r], part + cut[r]);
            cr_expect(memcmp(full, part, p->numel * sizeof(float)) == 0, "%s %s W=%d: shards differ from the whole",
                      preset, p->name, W);
        }
        // and single elements
        for (int k = 0; k < 16; k++) {
            size_t i = lcg(&s) % p->numel;
            float x = fc_init_value(p, seed, i), y;
            fc_init_range(p, seed, i, 1, &y);
            cr_expect(memcmp(&x, &full[i], sizeof x) == 0 && memcmp(&y, &full[i], sizeof y) == 0,
                      "%s %s[%zu]", preset, p->name, i);
        }
        free(full);
        free(part);
    }
    fc_model_free(&m);
}

Test(init, param_shards_equal_whole_mlp) { check_param_splits("mlp-tiny", 1234); }
Test(init, param_shards_equal_whole_gpt2) { check_param_splits("gpt2-tiny", 18446744073709551615ull); }

// FSDP's actual layout: each unit's FlatParameter zero-padded to a multiple of
// W, rank r owning [r S, (r+1) S). A rank initialises its shard by asking each
// parameter for the part of it that falls in the shard; the shards joined
// (without padding) must be the full flat buffer, and the padding stays 0.
static void check_fsdp_shards(const char *preset, uint64_t seed) {
    fc_model m;
    load_model(preset, &m);
    float *full = malloc(m.numel * sizeof(float));
    float *joined = malloc(m.numel * sizeof(float));
    fc_init_full(&m, seed, full);
    for (int W = 1; W <= 8; W++) {
        memset(joined, 0xCD, m.numel * sizeof(float));
        for (int u = 0; u < m.n_units; u++) {
            const fc_unit *U = &m.units[u];
            size_t S = (U->numel + (size_t)W - 1) / (size_t)W;
            for (int r = 0; r < W; r++) {
                size_t lo = (size_t)r * S, hi = lo + S;
                float *shard = malloc((S ? S : 1) * sizeof(float));
                for (size_t i = 0; i < S; i++) shard[i] = 0.0f;
                for (int k = 0; k < U->n_params; k++) {
                    const fc_param *p = &m.params[m.unit_params[U->first_param + k]];
                    size_t a = p->unit_offset, b = p->unit_offset + p->numel;
                    size_t x = a > lo ? a : lo, y = b < hi ? b : hi;
                    if (x >= y) continue;
                    fc_init_range(p, seed, x - a, y - x, shard + (x - lo));
                }
                for (size_t i = lo; i < hi; i++) {
                    if (i < U->numel)
                        joined[U->offset + i] = shard[i - lo];
                    else
                        cr_expect_eq(shard[i - lo], 0.0f, "padding must stay zero");
                }
                free(shard);
            }
        }
        cr_expect(memcmp(full, joined, m.numel * sizeof(float)) == 0, "%s W=%d: FSDP shards differ from full init",
                  preset, W);
    }
    free(full);
    free(joined);
    fc_model_free(&m);
}

Test(init, fsdp_shards_equal_full_mlp) { check_fsdp_shards("mlp-tiny", 7); }
Test(init, fsdp_shards_equal_full_gpt2) { check_fsdp_shards("gpt2-tiny", 7); }

Test(init, full_matches_per_param_ranges_and_is_deterministic) {
    const char *presets[2] = {"mlp-tiny", "gpt2-tiny"};
    for (int k = 0; k < 2; k++) {
        fc_model m;
        load_model(presets[k], &m);
        float *a = malloc(m.numel * sizeof(float)), *b = malloc(m.numel * sizeof(float));
        memset(a, 0xEE, m.numel * sizeof(float));
        fc_init_full(&m, 42, a);
        fc_init_full(&m, 42, b);
        cr_expect(memcmp(a, b, m.numel * sizeof(float)) == 0, "%s: init is not deterministic", presets[k]);
        for (int pi = 0; pi < m.n_params; pi++) {
            const fc_param *p = &m.params[pi];
            float *r = malloc(p->numel * sizeof(float));
            fc_init_range(p, 42, 0, p->numel, r);
            cr_expect(memcmp(r, a + p->offset, p->numel * sizeof(float)) == 0, "%s %s: full init at offset %zu",
                      presets[k], p->name, p->offset);
            free(r);
        }
        free(a);
        free(b);
        fc_model_free(&m);
    }
}

// Fraction of equal elements between two equally long float arrays.
static double frac_equal(const float *a, const float *b, size_t n) {
    size_t eq = 0;
    for (size_t i = 0; i < n; i++) eq += a[i] == b[i];
    return (double)eq / (double)n;
}

Test(init, seeds_and_names_give_different_values) {
    fc_model m;
    load_model("gpt2-tiny", &m);
    const fc_param *a = &m.params[fc_model_find(&m, "transformer.h.0.attn.c_attn.weight")];
    const fc_param *b = &m.params[fc_model_find(&m, "transformer.h.1.attn.c_attn.weight")];
    const fc_param *wte = &m.params[fc_model_find(&m, "transformer.wte.weight")];
    const fc_param *wpe = &m.params[fc_model_find(&m, "transformer.wpe.weight")];
    size_t n = a->numel;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    fc_init_range(a, 1, 0, n, x);
    fc_init_range(b, 1, 0, n, y);
    cr_expect_lt(frac_equal(x, y, n), 0.01, "two blocks' c_attn.weight share values");
    fc_init_range(a, 2, 0, n, y);
    cr_expect_lt(frac_equal(x, y, n), 0.01, "seeds 1 and 2 give the same c_attn.weight");
    fc_init_range(a, 1 + (1ull << 32), 0, n, y);
    cr_expect_lt(frac_equal(x, y, n), 0.01, "the seed's high word is ignored");
    size_t k = wpe->numel;
    fc_init_range(wte, 1, 0, k, x);
    fc_init_range(wpe, 1, 0, k, y);
    cr_expect_lt(frac_equal(x, y, k), 0.01, "wte and wpe share values");
    // shifted index: element i must not equal element i+1's stream
    fc_init_range(a, 1, 1, n - 1, y);
    cr_expect_lt(frac_equal(x, y, n - 1), 0.01, "neighbouring elements repeat");
    free(x);
    free(y);
    fc_model_free(&m);
}

// ---------------------------------------------------------------------------
// init distributions

typedef struct {
    double mean, std, kurt, maxabs;
} moments;

static moments stats(const float *x, size_t n) {
    double s = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        if (fabs(x[i]) > mx) mx = fabs(x[i]);
    }
    double mean = s / (double)n, s2 = 0, s4 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - mean;
        s2 += d * d;
        s4 += d * d * d * d;
    }
    double var = s2 / (double)n;
    moments r = {mean, sqrt(var), (s4 / (double)n) / (var * var), mx};
    return r;
}

// n ~ 100k samples of N(0, std): mean within 5 standard errors, std within
// 1.5% (its standard error is 1/sqrt(2n) = 0.22%), kurtosis 3 +- 0.1 (a uniform
// of the same std has 1.8), and the 2-sigma tail near 4.55%.
static void check_normal(const fc_model *m, const char *name, size_t first, double want_std) {
    int pi = fc_model_find(m, name);
    cr_assert_geq(pi, 0, "no %s", name);
    const fc_param *p = &m->params[pi];
    cr_assert_eq(p->init, FC_INIT_NORMAL, "%s is not normal-initialised", name);
    size_t n = 100000;
    if (n > p->numel - first) n = p->numel - first;
    float *x = malloc(n * sizeof(float));
    fc_init_range(p, 2024, first, n, x);
    moments s = stats(x, n);
    double se = want_std / sqrt((double)n);
    cr_expect_lt(fabs(s.mean), 5 * se, "%s: mean %.3g (std %.3g, n %zu)", name, s.mean, want_std, n);
    cr_expect_lt(fabs(s.std / want_std - 1), 0.015, "%s: std %.6g, want %.6g", name, s.std, want_std);
    cr_expect_lt(fabs(s.kurt - 3.0), 0.1, "%s: kurtosis %.4f, want 3 (normal)", name, s.kurt);
    size_t tail = 0;
    for (size_t i = 0; i < n; i++) tail += fabs(x[i]) > 2 * want_std;
    cr_expect_lt(fabs((double)tail / (double)n - 0.0455), 0.004, "%s: 2-sigma tail %.4f", name,
                 (double)tail / (double)n);
    free(x);
}

Test(init, gpt2_124m_normal_std) {
    fc_model m;
    load_model("gpt2-124m", &m);
    check_normal(&m, "transformer.wte.weight", 0, 0.02);
    check_normal(&m, "transformer.wte.weight", 20000000, 0.02);  // far into the tensor
    check_normal(&m, "transformer.wpe.weight", 0, 0.02);
    check_normal(&m, "transformer.h.5.attn.c_attn.weight", 300000, 0.02);
    check_normal(&m, "transformer.h.11.mlp.c_fc.weight", 0, 0.02);
    fc_model_free(&m);
}

Test(init, gpt2_124m_c_proj_scaled_std) {
    fc_model m;
    load_model("gpt2-124m", &m);
    const double std = 0.02 / sqrt(2.0 * 12);
    check_normal(&m, "transformer.h.0.attn.c_proj.weight", 0, std);
    check_normal(&m, "transformer.h.7.mlp.c_proj.weight", 1000000, std);
    check_normal(&m, "transformer.h.11.attn.c_proj.weight", 123456, std);
    fc_model_free(&m);
}

// LayerNorm weights exactly 1, every bias exactly 0, whatever the seed.
Test(init, gpt2_layernorm_and_biases_exact) {
    const char *presets[2] = {"gpt2-tiny", "gpt2-124m"};
    for (int k = 0; k < 2; k++) {
        fc_model m;
        load_model(presets[k], &m);
        int n_ln = 0, n_bias = 0;
        for (int pi = 0; pi < m.n_params; pi++) {
            const fc_param *p = &m.params[pi];
            const char *suffix = strrchr(p->name, '.');
            int is_ln = strstr(p->name, "ln_") != NULL;
            int is_bias = strcmp(suffix, ".bias") == 0;
            if (!is_ln && !is_bias) continue;
            float want = is_ln && !is_bias ? 1.0f : 0.0f;
            float *x = malloc(p->numel * sizeof(float));
            fc_init_range(p, 77 + k, 0, p->numel, x);
            size_t bad = 0;
            for (size_t i = 0; i < p->numel; i++) bad += memcmp(&x[i], &want, sizeof want) != 0;
            cr_expect_eq(bad, 0, "%s %s: %zu elements are not %g", presets[k], p->name, bad, (double)want);
            free(x);
            n_ln += is_ln;
            n_bias += is_bias;
        }
        int L = m.cfg.n_layer;
        cr_expect_eq(n_ln, 4 * L + 2, "%s: LayerNorm tensors", presets[k]);
        cr_expect_eq(n_bias, 6 * L + 1, "%s: bias tensors", presets[k]);
        fc_model_free(&m);
    }
}

// nn.Linear: weight and bias U(-1/sqrt(in), 1/sqrt(in)).
static void check_uniform(const fc_param *p, double bound, int strict_stats) {
    float *x = malloc(p->numel * sizeof(float));
    fc_init_range(p, 5, 0, p->numel, x);
    moments s = stats(x, p->numel);
    cr_expect_leq(s.maxabs, bound, "%s: |x| %.9g exceeds 1/sqrt(in) = %.9g", p->name, s.maxabs, bound);
    if (p->numel >= 50)
        cr_expect_gt(s.maxabs, 0.8 * bound, "%s: max |x| %.4g far below the bound %.4g", p->name, s.maxabs,
                     bound);
    if (strict_stats) {
        size_t n = p->numel;
        cr_expect_lt(fabs(s.mean), 5 * bound / sqrt(3.0 * (double)n), "%s: mean %.3g", p->name, s.mean);
        cr_expect_lt(fabs(s.std / (bound / sqrt(3.0)) - 1), 0.01, "%s: std %.5g, want %.5g", p->name, s.std,
                     bound / sqrt(3.0));
        cr_expect_lt(fabs(s.kurt - 1.8), 0.05, "%s: kurtosis %.4f, want 1.8 (uniform)", p->name, s.kurt);
        size_t bins[10] = {0};
        for (size_t i = 0; i < n; i++) {
            int b = (int)((x[i] / bound + 1.0) * 5.0);
            if (b == 10) b = 9;
            bins[b]++;
        }
        for (int b = 0; b < 10; b++)
            cr_expect_lt(fabs((double)bins[b] / (double)n - 0.1), 0.005, "%s: bin %d holds %.4f", p->name, b,
                         (double)bins[b] / (double)n);
    }
    free(x);
}

Test(init, mlp_uniform_bound) {
    fc_model m;
    load_model("mlp-tiny", &m);
    for (int pi = 0; pi < m.n_params; pi++) {
        const fc_param *p = &m.params[pi];
        int l = atoi(p->name + strlen("layers."));
        cr_expect_eq(p->init, FC_INIT_UNIFORM, "%s", p->name);
        check_uniform(p, 1.0 / sqrt((double)m.cfg.dims[l]), 0);
    }
    fc_model_free(&m);
    // a wide layer for the statistics
    fc_model_config c;
    memset(&c, 0, sizeof c);
    c.kind = FC_MODEL_MLP;
    snprintf(c.name, sizeof c.name, "wide");
    c.n_layers = 2;
    c.dims[0] = 400, c.dims[1] = 300, c.dims[2] = 10;
    fc_error e;
    cr_assert_eq(fc_model_config_validate(&c, &e), 0, "%s", e.msg);
    fc_model_build(&m, &c);
    check_uniform(&m.params[fc_model_find(&m, "layers.0.weight")], 1.0 / 20.0, 1);
    check_uniform(&m.params[fc_model_find(&m, "layers.1.weight")], 1.0 / sqrt(300.0), 0);
    fc_model_free(&m);
}

// ---------------------------------------------------------------------------
// data

static void batch_eq(const fc_batch *a, const fc_batch *b, const char *what) {
    cr_assert_eq(a->B, b->B, "%s: B", what);
    if (a->kind == FC_MODEL_MLP) {
        cr_expect(memcmp(a->features, b->features, (size_t)a->B * a->in_dim * sizeof(float)) == 0,
                  "%s: features differ", what);
        cr_expect(memcmp(a->target, b->target, (size_t)a->B * sizeof(int32_t)) == 0, "%s: targets differ", what);
    } else {
        size_t n = (size_t)a->B * a->T * sizeof(int32_t);
        cr_expect(memcmp(a->input, b->input, n) == 0, "%s: input differs", what);
        cr_expect(memcmp(a->target, b->target, n) == 0, "%s: target differs", what);
    }
}

// Rank r of W takes samples [r B / W, (r+1) B / W) of the global batch; B = 24
// with W = 1..8 includes uneven splits (5, 7). Every rank's fill must equal
// its range of the global batch, bitwise, for several steps.
static void check_data_splits(const char *preset, int T) {
    fc_model_config cfg;
    fc_error e;
    cr_assert_eq(fc_model_config_load(preset, &cfg, &e), 0, "%s", e.msg);
    const int B = 24;
    fc_batch global;
    fc_batch_alloc(&global, &cfg, B, T);
    for (int64_t step = 0; step < 3; step++) {
        fc_data_fill(&global, &cfg, 1234, step, 0);
        for (int W = 1; W <= 8; W++) {
            for (int r = 0; r < W; r++) {
                int lo = r * B / W, hi = (r + 1) * B / W;
                fc_batch part;
                fc_batch_alloc(&part, &cfg, hi - lo, T);
                fc_data_fill(&part, &cfg, 1234, step, lo);
                fc_batch view = fc_batch_slice(&global, lo, hi - lo);
                char what[128];
                snprintf(what, sizeof what, "%s step %lld W=%d rank %d [%d, %d)", preset, (long long)step, W, r,
                         lo, hi);
                batch_eq(&part, &view, what);
                fc_batch_free(&part);
            }
        }
        // and arbitrary single samples
        for (int s = 0; s < B; s += 5) {
            fc_batch one;
            fc_batch_alloc(&one, &cfg, 1, T);
            fc_data_fill(&one, &cfg, 1234, step, s);
            fc_batch view = fc_batch_slice(&global, s, 1);
            batch_eq(&one, &view, "single sample");
            fc_batch_free(&one);
        }
    }
    fc_batch_free(&global);
}

Test(data, rank_ranges_equal_global_batch_mlp) { check_data_splits("mlp-tiny", 0); }
Test(data, rank_ranges_equal_global_batch_gpt2) { check_data_splits("gpt2-tiny", 16); }

Test(data, gpt2_tokens_in_range_and_shifted) {
    const char *presets[2] = {"gpt2-tiny", "gpt2-124m"};
    const int Ts[2] = {32, 64};
    for (int k = 0; k < 2; k++) {
        fc_model_config cfg;
        fc_error e;
        cr_assert_eq(fc_model_config_load(presets[k], &cfg, &e), 0, "%s", e.msg);
        int B = 16, T = Ts[k], V = cfg.vocab_size;
        fc_batch b;
        fc_batch_alloc(&b, &cfg, B, T);
        cr_expect_eq(b.B, B);
        cr_expect_eq(b.T, T);
        fc_data_fill(&b, &cfg, 99, 5, 100);
        int distinct_first = 0;
        for (int i = 0; i < B; i++) {
            const int32_t *in = b.input + (size_t)i * T, *tg = b.target + (size_t)i * T;
            for (int t = 0; t < T; t++) {
                cr_expect(in[t] >= 0 && in[t] < V, "%s sample %d input[%d] = %d", presets[k], i, t, in[t]);
                cr_expect(tg[t] >= 0 && tg[t] < V, "%s sample %d target[%d] = %d", presets[k], i, t, tg[t]);
                if (t + 1 < T) cr_expect_eq(tg[t], in[t + 1], "%s sample %d: target[%d] != input[%d]", presets[k], i, t, t + 1);
            }
            if (i > 0 && in[0] != b.input[0]) distinct_first++;
        }
        cr_expect_gt(distinct_first, B / 2, "%s: samples look alike", presets[k]);
        fc_batch_free(&b);
    }
}

Test(data, mlp_targets_in_range) {
    fc_model_config cfg;
    fc_error e;
    cr_assert_eq(fc_model_config_load("mlp-tiny", &cfg, &e), 0, "%s", e.msg);
    int C = cfg.dims[cfg.n_layers];
    fc_batch b;
    fc_batch_alloc(&b, &cfg, 500, 0);
    cr_expect_eq(b.in_dim, cfg.dims[0]);
    fc_data_fill(&b, &cfg, 3, 0, 0);
    int seen[FC_MLP_MAX_LAYERS * 64] = {0};
    double s = 0, s2 = 0;
    size_t n = (size_t)b.B * b.in_dim;
    for (int i = 0; i < b.B; i++) {
        cr_expect(b.target[i] >= 0 && b.target[i] < C, "target %d = %d", i, b.target[i]);
        if (b.target[i] >= 0 && b.target[i] < C) seen[b.target[i]] = 1;
    }
    for (size_t i = 0; i < n; i++) {
        s += b.features[i];
        s2 += (double)b.features[i] * b.features[i];
    }
    int classes = 0;
    for (int c = 0; c < C; c++) classes += seen[c];
    cr_expect_geq(classes, 4, "only %d classes in 500 samples", classes);
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    cr_expect_lt(fabs(mean), 0.05, "features mean %.4f", mean);
    cr_expect_lt(fabs(sd - 1), 0.05, "features std %.4f", sd);
    fc_batch_free(&b);
}

Test(data, steps_and_seeds_differ_and_repeat) {
    const char *presets[2] = {"mlp-tiny", "gpt2-tiny"};
    for (int k = 0; k < 2; k++) {
        fc_model_config cfg;
        fc_error e;
        cr_assert_eq(fc_model_config_load(presets[k], &cfg, &e), 0, "%s", e.msg);
        int B = 8, T = 16;
        fc_batch a, b;
        fc_batch_alloc(&a, &cfg, B, T);
        fc_batch_alloc(&b, &cfg, B, T);
        size_t n = cfg.kind == FC_MODEL_MLP ? (size_t)B * cfg.dims[0] : (size_t)B * T;
        int32_t *ia = cfg.kind == FC_MODEL_MLP ? NULL : a.input, *ib = cfg.kind == FC_MODEL_MLP ? NULL : b.input;
        // same (seed, step) twice: identical
        fc_data_fill(&a, &cfg, 11, 3, 0);
        fc_data_fill(&b, &cfg, 11, 3, 0);
        batch_eq(&a, &b, "same seed and step");
        // neighbouring steps, other seed, shifted samples: different
        const struct {
            uint64_t seed;
            int64_t step, first;
            const char *what;
        } other[4] = {{11, 4, 0, "step 4 vs 3"}, {12, 3, 0, "seed 12 vs 11"}, {11, 3, 1, "samples shifted by 1"},
                      {11 + (1ull << 32), 3, 0, "seed high word"}};
        for (int o = 0; o < 4; o++) {
            fc_data_fill(&b, &cfg, other[o].seed, other[o].step, other[o].first);
            size_t same = 0;
            if (cfg.kind == FC_MODEL_MLP)
                for (size_t i = 0; i < n; i++) same += a.features[i] == b.features[i];
            else
                for (size_t i = 0; i < n; i++) same += ia[i] == ib[i];
            cr_expect_lt((double)same / (double)n, 0.2, "%s: %s gives %zu of %zu equal values", presets[k],
                         other[o].what, same, n);
        }
        // step is an int64: large steps are fine and differ from small ones
        fc_data_fill(&b, &cfg, 11, 3 + (1ll << 40), 0);
        size_t same = 0;
        for (int i = 0; i < B; i++) same += a.target[i] == b.target[i];
        cr_expect_lt(same, (size_t)B, "%s: step 3 + 2^40 repeats step 3", presets[k]);
        fc_batch_free(&a);
        fc_batch_free(&b);
    }
}

Test(data, batch_slice_views) {
    const char *presets[2] = {"mlp-tiny", "gpt2-tiny"};
    for (int k = 0; k < 2; k++) {
        fc_model_config cfg;
        fc_error e;
        cr_assert_eq(fc_model_config_load(presets[k], &cfg, &e), 0, "%s", e.msg);
        int B = 12, T = 8;
        fc_batch g;
        fc_batch_alloc(&g, &cfg, B, T);
        fc_data_fill(&g, &cfg, 5, 2, 0);
        for (int first = 0; first < B; first += 3) {
            int n = B - first < 4 ? B - first : 4;
            fc_batch v = fc_batch_slice(&g, first, n);
            cr_expect_eq(v.B, n);
            cr_expect_eq(v.kind, g.kind);
            cr_expect_eq(v.T, g.T);
            cr_expect_eq(v.in_dim, g.in_dim);
            if (cfg.kind == FC_MODEL_MLP) {
                cr_expect_eq(v.features, g.features + (size_t)first * g.in_dim, "a view, not a copy");
                cr_expect_eq(v.target, g.target + first);
            } else {
                cr_expect_eq(v.input, g.input + (size_t)first * T, "a view, not a copy");
                cr_expect_eq(v.target, g.target + (size_t)first * T);
            }
            fc_batch fresh;
            fc_batch_alloc(&fresh, &cfg, n, T);
            fc_data_fill(&fresh, &cfg, 5, 2, first);
            batch_eq(&fresh, &v, "slice vs fill at its offset");
            fc_batch_free(&fresh);
            // a slice of a slice
            if (n >= 2) {
                fc_batch vv = fc_batch_slice(&v, 1, n - 1);
                fc_batch direct = fc_batch_slice(&g, first + 1, n - 1);
                batch_eq(&vv, &direct, "slice of a slice");
            }
        }
        fc_batch_free(&g);
    }
}

Test(data, alloc_and_free) {
    fc_model_config cfg;
    fc_error e;
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &cfg, &e), 0, "%s", e.msg);
    fc_batch b;
    fc_batch_alloc(&b, &cfg, 3, 5);
    cr_expect_eq(b.kind, FC_MODEL_GPT2);
    cr_expect_eq(b.B, 3);
    cr_expect_eq(b.T, 5);
    cr_expect_null(b.features);
    cr_expect_not_null(b.input);
    cr_expect_not_null(b.target);
    fc_batch_free(&b);
    cr_expect_null(b.input);
    cr_expect_null(b.target);
    cr_assert_eq(fc_model_config_load("mlp-tiny", &cfg, &e), 0, "%s", e.msg);
    fc_batch_alloc(&b, &cfg, 4, 0);
    cr_expect_eq(b.kind, FC_MODEL_MLP);
    cr_expect_eq(b.in_dim, 13);
    cr_expect_null(b.input);
    cr_expect_not_null(b.features);
    fc_batch_free(&b);
}
