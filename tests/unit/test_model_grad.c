// tests/unit/test_model_grad.c — P13 for whole models, and the training-step
// semantics of the local trainer (docs/contract.md §4, §8).
//
//  - Finite differences: in double (the fc_refmath_f64 build), dLoss/dparam of
//    the full model against central differences of the mean loss, for a random
//    subset of elements of EVERY parameter tensor, including both gradient
//    paths of the tied wte (rows of tokens that occur in the batch get the
//    embedding path and the LM-head path, other rows only the head path).
//  - Stage-wise forward/backward equals the model-level calls bitwise, with
//    every parameter outside the stage's unit poisoned with NaN, and each stage
//    writes gradients only inside its unit.
//  - Backward accumulates; float agrees with double; K micro-batches give the
//    gradient of the joined batch; clip_grad_norm for norm types 1, 2, inf;
//    the loss at init is log(V).
//
// Both builds of the model math are used in one file: the float API comes in
// through local.h, then forward.h is included a second time as the double
// build (FC_REAL_DOUBLE, `real` renamed so the two typedefs do not clash).
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "data.h"
#include "init.h"
#include "clip.h"
#include "local.h"
#include "model.h"
#include "optim.h"

// the double build of reference/forward.h: fc_acts_f64, fc_model_forward_f64, ...
#undef FC_FORWARD_H
#undef FC_REAL_H
#undef RN
#define FC_REAL_DOUBLE
#define real real_f64
#include "forward.h"
#undef real
#undef FC_REAL_DOUBLE

// ---------------------------------------------------------------------------
// helpers

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}
static double unif(uint32_t *s) { return (double)lcg(s) / 16777216.0 * 2.0 - 1.0; }  // [-1, 1)

static fc_model_config preset(const char *name) {
    fc_model_config c;
    fc_error e;
    cr_assert_eq(fc_model_config_load(name, &c, &e), 0, "%s: %s", name, e.msg);
    return c;
}

static fc_model_config gpt2_config(const char *name, int V, int P, int C, int L, int H) {
    fc_model_config c;
    memset(&c, 0, sizeof c);
    c.kind = FC_MODEL_GPT2;
    snprintf(c.name, sizeof c.name, "%s", name);
    c.vocab_size = V, c.n_positions = P, c.n_embd = C, c.n_layer = L, c.n_head = H;
    c.layer_norm_epsilon = 1e-5f;
    fc_error e;
    cr_assert_eq(fc_model_config_validate(&c, &e), 0, "%s", e.msg);
    return c;
}

static fc_model_config llama_config(const char *name, int V, int C, int L, int H, int KV, int hd, int I, int tied) {
    fc_model_config c;
    memset(&c, 0, sizeof c);
    c.kind = FC_MODEL_LLAMA;
    snprintf(c.name, sizeof c.name, "%s", name);
    c.vocab_size = V, c.n_positions = 16, c.n_embd = C, c.n_layer = L, c.n_head = H;
    c.n_kv_head = KV, c.head_dim = hd, c.intermediate_size = I, c.tie_word_embeddings = tied;
    c.layer_norm_epsilon = 1e-5f, c.rope_theta = 500.0, c.initializer_range = 0.02f;  // theta small: fast rotations at T <= 8
    fc_error e;
    cr_assert_eq(fc_model_config_validate(&c, &e), 0, "%s", e.msg);
    return c;
}

// Initial weights in float, then made generic so no gradient vanishes by
// symmetry: normal-init weights scaled by `scale` (gradients not tiny),
// LayerNorm weights 1 + 0.2 u and zero biases 0.1 u (u uniform in [-1, 1)).
static void init_params(const fc_model *m, uint64_t seed, float scale, float *p) {
    fc_init_full(m, seed, p);
    uint32_t s = (uint32_t)seed * 2654435761u + 1;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *q = &m->params[i];
        float *x = p + q->offset;
        for (size_t k = 0; k < q->numel; k++) {
            switch (q->init) {
            case FC_INIT_NORMAL: x[k] *= scale; break;
            case FC_INIT_ONES: x[k] = (float)(1.0 + 0.2 * unif(&s)); break;
            case FC_INIT_ZEROS: x[k] = (float)(0.1 * unif(&s)); break;
            case FC_INIT_UNIFORM: x[k] *= scale > 1 ? 2.0f : 1.0f; break;
            }
        }
    }
}

typedef struct {
    fc_model m;
    fc_batch batch;
    int B, T;
    double *p, *g;       // double params / grads
    double *act_mem;
    fc_acts_f64 acts;
} dmodel;

static void dmodel_init(dmodel *d, const fc_model_config *cfg, int B, int T, uint64_t seed, float scale) {
    memset(d, 0, sizeof *d);
    fc_model_build(&d->m, cfg);
    d->B = B;
    d->T = fc_model_has_tokens(cfg) ? T : 0;
    fc_batch_alloc(&d->batch, cfg, B, d->T);
    fc_data_fill(&d->batch, cfg, seed, 0, 0);
    size_t n = d->m.numel;
    float *pf = malloc(n * sizeof(float));
    init_params(&d->m, seed, scale, pf);
    d->p = malloc(n * sizeof(double));
    d->g = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) d->p[i] = pf[i];
    free(pf);
    size_t an = fc_acts_numel_f64(&d->m, B, d->T);
    d->act_mem = malloc(an * sizeof(double));
    fc_acts_init_f64(&d->acts, &d->m, B, d->T, d->act_mem);
}

static void dmodel_free(dmodel *d) {
    free(d->p);
    free(d->g);
    free(d->act_mem);
    fc_batch_free(&d->batch);
    fc_model_free(&d->m);
}

static double dloss(dmodel *d) { return fc_model_forward_f64(&d->m, d->p, &d->batch, &d->acts); }

// Analytic gradient of the mean loss into d->g (zeroed first).
static double dgrad(dmodel *d) {
    memset(d->g, 0, d->m.numel * sizeof(double));
    double l = dloss(d);
    fc_model_backward_f64(&d->m, d->p, &d->batch, &d->acts, d->g, 1.0 / d->acts.NT);
    return l;
}

// ---------------------------------------------------------------------------
// P13: finite differences for every parameter tensor

static int in_batch(const dmodel *d, int tok) {
    for (int i = 0; i < d->B * d->T; i++)
        if (d->batch.input[i] == tok) return 1;
    return 0;
}

static void check_fd(const char *what, const fc_model_config *cfg, int B, int T, uint64_t seed) {
    dmodel d;
    dmodel_init(&d, cfg, B, T, seed, 10.0f);
    dgrad(&d);
    double *g = malloc(d.m.numel * sizeof(double));
    memcpy(g, d.g, d.m.numel * sizeof(double));
    const double h = 1e-5;
    uint32_t s = (uint32_t)seed + 17;
    int checked_tensors = 0, tied_rows_in = 0, tied_rows_out = 0;
    for (int pi = 0; pi < d.m.n_params; pi++) {
        const fc_param *p = &d.m.params[pi];
        size_t idx[10];
        int n = 0;
        int is_wte = strcmp(p->name, "transformer.wte.weight") == 0 || strcmp(p->name, "model.embed_tokens.weight") == 0 ||
                     strcmp(p->name, "lm_head.weight") == 0;
        int is_wpe = strcmp(p->name, "transformer.wpe.weight") == 0;
        if (is_wte) {
            int C = cfg->n_embd, V = cfg->vocab_size;
            // 5 elements in rows of tokens that are in the batch (embedding +
            // head paths), then up to 5 in rows that are not (head path only)
            for (int k = 0; k < 5; k++) {
                int tok = d.batch.input[lcg(&s) % (uint32_t)(B * T)];
                idx[n++] = (size_t)tok * C + lcg(&s) % (uint32_t)C;
                tied_rows_in++;
            }
            for (int k = 0, tries = 0; k < 5 && tries < 1000; tries++) {
                int tok = (int)(lcg(&s) % (uint32_t)V);
                if (in_batch(&d, tok)) continue;
                idx[n++] = (size_t)tok * C + lcg(&s) % (uint32_t)C;
                tied_rows_out++;
                k++;
            }
        } else if (is_wpe) {
            // positions 0..T-1 are used; rows >= T must have zero gradient
            int C = cfg->n_embd;
            for (int k = 0; k < 7; k++) idx[n++] = (size_t)(lcg(&s) % (uint32_t)T) * C + lcg(&s) % (uint32_t)C;
            if (T < cfg->n_positions) idx[n++] = (size_t)(T + lcg(&s) % (uint32_t)(cfg->n_positions - T)) * C;
        } else {
            idx[n++] = 0;
            idx[n++] = p->numel - 1;
            for (int k = 0; k < 6; k++) idx[n++] = lcg(&s) % p->numel;
        }
        double maxabs = 0;
        for (int k = 0; k < n; k++) {
            size_t i = p->offset + idx[k];
            double saved = d.p[i];
            d.p[i] = saved + h;
            double lp = dloss(&d);
            d.p[i] = saved - h;
            double lm = dloss(&d);
            d.p[i] = saved;
            double num = (lp - lm) / (2 * h), ana = g[i];
            cr_expect(fabs(ana - num) <= 1e-9 + 1e-6 * fabs(num),
                      "%s: d loss / d %s[%zu]: analytic %.12g, finite difference %.12g (diff %.3g)", what, p->name,
                      idx[k], ana, num, ana - num);
            if (fabs(num) > maxabs) maxabs = fabs(num);
        }
        // a check against an all-zero gradient would prove nothing
        cr_expect_gt(maxabs, 1e-5, "%s: %s: every checked gradient is ~0 (max %.3g)", what, p->name, maxabs);
        checked_tensors++;
    }
    cr_expect_eq(checked_tensors, d.m.n_params);
    if (fc_model_has_tokens(cfg)) {
        cr_expect_gt(tied_rows_in, 0);
        cr_expect_gt(tied_rows_out, 0, "%s: every token is in the batch; the head-only path is untested", what);
    }
    free(g);
    dmodel_free(&d);
}

Test(fd, mlp_tiny) {
    fc_model_config c = preset("mlp-tiny");
    check_fd("mlp-tiny", &c, 8, 0, 5);
}

Test(fd, gpt2_tiny) {
    fc_model_config c = preset("gpt2-tiny");
    check_fd("gpt2-tiny", &c, 3, 8, 5);
}

Test(fd, gpt2_seq_len_1) {
    fc_model_config c = preset("gpt2-tiny");
    check_fd("gpt2-tiny T=1", &c, 4, 1, 6);
}

Test(fd, gpt2_three_layers_hand_config) {
    fc_model_config c = gpt2_config("gpt2-L3", 23, 8, 12, 3, 3);
    check_fd("gpt2 L=3", &c, 2, 6, 7);
}

Test(fd, gpt2_one_head_full_context) {
    fc_model_config c = gpt2_config("gpt2-H1", 11, 5, 8, 1, 1);
    check_fd("gpt2 H=1 T=P", &c, 2, 5, 8);
}

// llama: RMSNorm, RoPE, GQA, SwiGLU, tied and untied heads (every tensor,
// the embedding's rows in and out of the batch as for gpt2's wte)
Test(fd, llama_micro_tied_gqa) {
    fc_model_config c = preset("llama-micro");
    check_fd("llama-micro", &c, 3, 8, 5);
}

Test(fd, llama_tiny_untied_head_dim_6) {
    fc_model_config c = preset("llama-tiny");
    check_fd("llama-tiny", &c, 2, 8, 9);
}

Test(fd, llama_mha_two_layers_hand_config) {
    fc_model_config c = llama_config("llama-MHA", 19, 12, 2, 3, 3, 4, 20, 1);
    check_fd("llama MHA", &c, 2, 6, 11);
}

// T = 2: the shortest sequence where q and k have a gradient (at T = 1 the
// softmax has one key, and q_proj's and k_proj's gradients are exactly 0)
Test(fd, llama_gqa_4_to_1_seq_len_2) {
    fc_model_config c = llama_config("llama-GQA4", 11, 8, 1, 4, 1, 2, 8, 0);
    check_fd("llama GQA 4:1 T=2", &c, 4, 2, 12);
}

// LoRA adapters (lora_A, lora_B) beside their base weights: every tensor,
// adapters included, against finite differences (the base weights still get
// their gradient here: freezing is the trainer's, not the model's). The
// init's zero lora_B is made generic, so lora_A's gradient is not 0.
Test(fd, llama_micro_lora_on_attention) {
    fc_model_config c = preset("llama-micro");
    fc_error e;
    cr_assert_eq(fc_model_config_set_lora(&c, "2:5:[qv]_proj", &e), 0, "%s", e.msg);
    check_fd("llama-micro LoRA r=2 alpha=5 q,v", &c, 3, 8, 5);
}

Test(fd, llama_tiny_lora_on_every_linear) {
    fc_model_config c = preset("llama-tiny");
    fc_error e;
    cr_assert_eq(fc_model_config_set_lora(&c, "3:4:proj", &e), 0, "%s", e.msg);
    check_fd("llama-tiny LoRA r=3 alpha=4 all", &c, 2, 8, 9);
}

// The tied wte's gradient is the sum of the head path and the embedding path:
// on a row of a token in the batch, the embedding path alone (the gradient of
// `encoded`, summed over the token's positions) must be non-negligible, so a
// gradient missing either path fails the finite-difference check above.
Test(fd, tied_wte_both_paths_matter) {
    fc_model_config c = preset("gpt2-tiny");
    dmodel d;
    dmodel_init(&d, &c, 3, 8, 5, 10.0f);
    dgrad(&d);
    const fc_param *wte = &d.m.params[fc_model_find(&d.m, "transformer.wte.weight")];
    // head-only gradient: run the model backward on a copy without the EMBED
    // stage (stage 0); the difference is the embedding path.
    double *head = calloc(d.m.numel, sizeof(double));
    dloss(&d);
    const double *up[FC_MLP_MAX_LAYERS + 8];
    double *ug[FC_MLP_MAX_LAYERS + 8];
    for (int u = 0; u < d.m.n_units; u++) {
        up[u] = d.p + d.m.units[u].offset;
        ug[u] = head + d.m.units[u].offset;
    }
    for (int st = d.m.n_stages - 1; st >= 1; st--)
        fc_stage_backward_f64(&d.m, st, up, &d.batch, &d.acts, ug, 1.0 / d.acts.NT);
    int tok = d.batch.input[0];
    double emb = 0, hd = 0;
    for (int k = 0; k < c.n_embd; k++) {
        size_t i = wte->offset + (size_t)tok * c.n_embd + k;
        emb += fabs(d.g[i] - head[i]);
        hd += fabs(head[i]);
    }
    cr_expect_gt(emb, 1e-3, "embedding path of row %d: %.3g", tok, emb);
    cr_expect_gt(hd, 1e-3, "head path of row %d: %.3g", tok, hd);
    free(head);
    dmodel_free(&d);
}

// ---------------------------------------------------------------------------
// stage-wise == model-level, with each stage seeing only its unit

// Each stage gets a table in which only its own unit has a buffer (a private
// copy); every other unit's entry is NULL, so a stage that reached outside its
// unit would crash, and its gradients land in a private buffer too.
static void check_stagewise_float(const fc_model_config *cfg, int B, int T) {
    fc_model m;
    fc_model_build(&m, cfg);
    int Tm = fc_model_has_tokens(cfg) ? T : 0;
    fc_batch b;
    fc_batch_alloc(&b, cfg, B, Tm);
    fc_data_fill(&b, cfg, 3, 1, 0);
    size_t n = m.numel;
    float *p = malloc(n * sizeof(float));
    float *g1 = calloc(n, sizeof(float)), *g2 = calloc(n, sizeof(float));
    init_params(&m, 3, 5.0f, p);
    size_t an = fc_acts_numel(&m, B, Tm);
    float *mem1 = malloc(an * sizeof(float)), *mem2 = malloc(an * sizeof(float));
    fc_acts a1, a2;
    fc_acts_init(&a1, &m, B, Tm, mem1);
    fc_acts_init(&a2, &m, B, Tm, mem2);
    float l1 = fc_model_forward(&m, p, &b, &a1);
    fc_model_backward(&m, p, &b, &a1, g1, 1.0f / (float)a1.NT);
    // private per-unit parameter copies and gradient buffers
    float **pu = calloc((size_t)m.n_units, sizeof *pu), **gu = calloc((size_t)m.n_units, sizeof *gu);
    const float **up = calloc((size_t)m.n_units, sizeof *up);
    float **ug = calloc((size_t)m.n_units, sizeof *ug);
    for (int u = 0; u < m.n_units; u++) {
        pu[u] = malloc(m.units[u].numel * sizeof(float));
        gu[u] = calloc(m.units[u].numel, sizeof(float));
        memcpy(pu[u], p + m.units[u].offset, m.units[u].numel * sizeof(float));
    }
    for (int s = 0; s < m.n_stages; s++) {
        int u = m.stages[s].unit;
        up[u] = pu[u];
        fc_stage_forward(&m, s, up, &b, &a2);
        up[u] = NULL;
    }
    float l2 = a2.loss_sum / (float)a2.NT;
    cr_expect_eq(memcmp(&l1, &l2, sizeof l1), 0, "%s: stage-wise loss %.9g vs model %.9g", cfg->name, (double)l2,
                 (double)l1);
    for (int s = m.n_stages - 1; s >= 0; s--) {
        int u = m.stages[s].unit;
        up[u] = pu[u];
        ug[u] = gu[u];
        fc_stage_backward(&m, s, up, &b, &a2, ug, 1.0f / (float)a2.NT);
        up[u] = NULL;
        ug[u] = NULL;
    }
    for (int u = 0; u < m.n_units; u++) {
        memcpy(g2 + m.units[u].offset, gu[u], m.units[u].numel * sizeof(float));
        free(pu[u]);
        free(gu[u]);
    }
    cr_expect_eq(memcmp(g1, g2, n * sizeof(float)), 0, "%s: stage-wise gradients differ from the model's", cfg->name);
    free(pu), free(gu), free(up), free(ug);
    free(p), free(g1), free(g2), free(mem1), free(mem2);
    fc_batch_free(&b);
    fc_model_free(&m);
}

static void check_stagewise_double(const fc_model_config *cfg, int B, int T) {
    dmodel d;
    dmodel_init(&d, cfg, B, T, 4, 5.0f);
    size_t n = d.m.numel;
    double l1 = dgrad(&d);
    double *g2 = calloc(n, sizeof(double));
    double *mem2 = malloc(d.acts.numel * sizeof(double));
    fc_acts_f64 a2;
    fc_acts_init_f64(&a2, &d.m, B, d.T, mem2);
    const double **up = calloc((size_t)d.m.n_units, sizeof *up);
    double **ug = calloc((size_t)d.m.n_units, sizeof *ug);
    for (int s = 0; s < d.m.n_stages; s++) {
        int u = d.m.stages[s].unit;
        up[u] = d.p + d.m.units[u].offset;
        fc_stage_forward_f64(&d.m, s, up, &d.batch, &a2);
        up[u] = NULL;
    }
    double l2 = a2.loss_sum / (double)a2.NT;
    cr_expect_eq(memcmp(&l1, &l2, sizeof l1), 0, "%s: stage-wise loss %.17g vs model %.17g", cfg->name, l2, l1);
    for (int s = d.m.n_stages - 1; s >= 0; s--) {
        int u = d.m.stages[s].unit;
        up[u] = d.p + d.m.units[u].offset;
        ug[u] = g2 + d.m.units[u].offset;
        fc_stage_backward_f64(&d.m, s, up, &d.batch, &a2, ug, 1.0 / a2.NT);
        up[u] = NULL;
        ug[u] = NULL;
    }
    cr_expect_eq(memcmp(d.g, g2, n * sizeof(double)), 0, "%s: stage-wise gradients differ", cfg->name);
    free(up), free(ug), free(g2), free(mem2);
    dmodel_free(&d);
}

Test(stagewise, equals_model_bitwise_mlp) {
    fc_model_config c = preset("mlp-tiny");
    check_stagewise_float(&c, 6, 0);
    check_stagewise_double(&c, 6, 0);
}

Test(stagewise, equals_model_bitwise_gpt2) {
    fc_model_config c = preset("gpt2-tiny");
    check_stagewise_float(&c, 3, 7);
    check_stagewise_double(&c, 3, 7);
    fc_model_config c3 = gpt2_config("gpt2-L3", 23, 8, 12, 3, 3);
    check_stagewise_float(&c3, 2, 8);
    check_stagewise_double(&c3, 2, 1);
}

Test(stagewise, equals_model_bitwise_llama) {
    const char *names[] = {"llama-micro", "llama-tiny"};
    for (int i = 0; i < 2; i++) {
        fc_model_config c = preset(names[i]);
        check_stagewise_float(&c, 3, 7);
        check_stagewise_double(&c, 2, 5);
    }
}

// ---------------------------------------------------------------------------
// backward accumulates

static void check_accumulates(const fc_model_config *cfg, int B, int T) {
    fc_model m;
    fc_model_build(&m, cfg);
    int Tm = fc_model_has_tokens(cfg) ? T : 0;
    fc_batch b;
    fc_batch_alloc(&b, cfg, B, Tm);
    fc_data_fill(&b, cfg, 9, 0, 0);
    size_t n = m.numel;
    float *p = malloc(n * sizeof(float)), *g1 = calloc(n, sizeof(float)), *g2 = calloc(n, sizeof(float));
    float *g0 = malloc(n * sizeof(float)), *g3 = malloc(n * sizeof(float));
    init_params(&m, 9, 5.0f, p);
    float *mem = malloc(fc_acts_numel(&m, B, Tm) * sizeof(float));
    fc_acts a;
    fc_acts_init(&a, &m, B, Tm, mem);
    fc_model_forward(&m, p, &b, &a);
    fc_model_backward(&m, p, &b, &a, g1, 1.0f / (float)a.NT);
    fc_model_forward(&m, p, &b, &a);
    fc_model_backward(&m, p, &b, &a, g2, 1.0f / (float)a.NT);
    fc_model_backward(&m, p, &b, &a, g2, 1.0f / (float)a.NT);  // same forward, backward again
    // onto a non-zero buffer
    uint32_t s = 77;
    for (size_t i = 0; i < n; i++) g0[i] = (float)unif(&s);
    memcpy(g3, g0, n * sizeof(float));
    fc_model_backward(&m, p, &b, &a, g3, 1.0f / (float)a.NT);
    // the tied embedding (the root's first parameter) has two contributions per element
    int wte = fc_model_tied(cfg) ? 0 : -1;
    size_t nz = 0;
    for (int pi = 0; pi < m.n_params; pi++) {
        const fc_param *q = &m.params[pi];
        for (size_t k = 0; k < q->numel; k++) {
            size_t i = q->offset + k;
            float two = 2.0f * g1[i], sum = g0[i] + g1[i];
            nz += g1[i] != 0.0f;
            if (pi != wte) {
                // one contribution per element: exactly 2x and exactly g0 + g
                cr_expect_eq(memcmp(&g2[i], &two, sizeof two), 0, "%s[%zu]: twice %.9g, 2x once %.9g", q->name, k,
                             (double)g2[i], (double)two);
                cr_expect_eq(memcmp(&g3[i], &sum, sizeof sum), 0, "%s[%zu]: onto g0 %.9g, g0 + g %.9g", q->name, k,
                             (double)g3[i], (double)sum);
            } else {
                // wte gets two contributions (head, embedding): rounding may differ
                cr_expect(fabsf(g2[i] - two) <= 4e-7f * fabsf(two) + 1e-12f, "%s[%zu]: twice %.9g, 2x once %.9g",
                          q->name, k, (double)g2[i], (double)two);
                cr_expect(fabsf(g3[i] - sum) <= 2.4e-7f * (fabsf(g0[i]) + fabsf(g1[i])), "%s[%zu]: onto g0 %.9g, g0 + g %.9g",
                          q->name, k, (double)g3[i], (double)sum);
            }
        }
    }
    cr_expect_gt(nz, n / 2, "%s: most gradients are zero", cfg->name);
    free(p), free(g0), free(g1), free(g2), free(g3), free(mem);
    fc_batch_free(&b);
    fc_model_free(&m);
}

Test(accumulate, backward_adds_mlp) {
    fc_model_config c = preset("mlp-tiny");
    check_accumulates(&c, 5, 0);
}

Test(accumulate, backward_adds_llama) {
    fc_model_config c = preset("llama-micro");  // tied: the embedding's two contributions are exempt
    check_accumulates(&c, 2, 9);
    fc_model_config u = preset("llama-tiny");   // untied: every tensor exactly 2x
    check_accumulates(&u, 2, 5);
}

Test(accumulate, backward_adds_gpt2) {
    fc_model_config c = preset("gpt2-tiny");
    check_accumulates(&c, 2, 9);
}

// ---------------------------------------------------------------------------
// float vs double

static void check_float_vs_double(const fc_model_config *cfg, int B, int T) {
    dmodel d;
    dmodel_init(&d, cfg, B, T, 12, 5.0f);
    double ld = dgrad(&d);
    size_t n = d.m.numel;
    float *p = malloc(n * sizeof(float)), *g = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)d.p[i];  // exact: d.p came from floats
    float *mem = malloc(fc_acts_numel(&d.m, B, d.T) * sizeof(float));
    fc_acts a;
    fc_acts_init(&a, &d.m, B, d.T, mem);
    float lf = fc_model_forward(&d.m, p, &d.batch, &a);
    fc_model_backward(&d.m, p, &d.batch, &a, g, 1.0f / (float)a.NT);
    cr_expect(fabs(lf - ld) <= 1e-5 * fabs(ld), "%s: loss float %.9g double %.17g", cfg->name, (double)lf, ld);
    for (int pi = 0; pi < d.m.n_params; pi++) {
        const fc_param *q = &d.m.params[pi];
        double mx = 0;
        for (size_t k = 0; k < q->numel; k++) mx = fmax(mx, fabs(d.g[q->offset + k]));
        size_t bad = 0, first_bad = 0;
        for (size_t k = 0; k < q->numel; k++) {
            double gd = d.g[q->offset + k], gf = g[q->offset + k];
            // 1e-4 relative, with a floor at 1e-5 of the tensor's largest
            // gradient for elements that are themselves sums that cancel
            if (fabs(gf - gd) > 1e-4 * fabs(gd) + 1e-5 * mx) {
                if (!bad) first_bad = k;
                bad++;
            }
        }
        cr_expect_eq(bad, 0, "%s %s: %zu elements disagree; first [%zu] float %.9g double %.12g", cfg->name, q->name,
                     bad, first_bad, (double)g[q->offset + first_bad], d.g[q->offset + first_bad]);
    }
    free(p), free(g), free(mem);
    dmodel_free(&d);
}

Test(precision, float_matches_double_mlp) {
    fc_model_config c = preset("mlp-tiny");
    check_float_vs_double(&c, 16, 0);
}

Test(precision, float_matches_double_llama) {
    fc_model_config c = preset("llama-tiny");
    check_float_vs_double(&c, 4, 16);
    fc_model_config m = preset("llama-micro");
    check_float_vs_double(&m, 3, 8);
}

Test(precision, float_matches_double_gpt2) {
    fc_model_config c = preset("gpt2-tiny");
    check_float_vs_double(&c, 4, 16);
    fc_model_config c3 = gpt2_config("gpt2-L3", 23, 8, 12, 3, 3);
    check_float_vs_double(&c3, 3, 8);
}

// ---------------------------------------------------------------------------
// the local trainer: accumulation, clipping, loss at init

static fc_run_config run_cfg(const char *model, int B, int T, int K) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    c.model = preset(model);
    c.global_batch = B;
    c.seq_len = T;
    c.grad_accum = K;
    c.seed = 31;
    return c;
}

static void local_ok(fc_local *L, const fc_run_config *c) {
    fc_error e;
    cr_assert_eq(fc_local_create(L, c, &e), 0, "%s", e.msg);
}

// K micro-batches, each mean loss scaled by 1/K, give the gradient of the mean
// over the joined batch (docs/contract.md §4, P6), and that gradient is the double
// model's on the global batch of step 0.
static void check_grad_accum(const char *model, int B, int T) {
    fc_run_config c1 = run_cfg(model, B, T, 1);
    fc_local L1;
    local_ok(&L1, &c1);
    fc_local_step(&L1);
    size_t n = L1.model.numel;
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(L1.grads[i]));
    cr_assert_gt(mx, 0, "%s: zero gradient", model);
    const int Ks[2] = {2, 4};
    for (int k = 0; k < 2; k++) {
        fc_run_config cK = run_cfg(model, B, T, Ks[k]);
        fc_local LK;
        local_ok(&LK, &cK);
        fc_local_step(&LK);
        cr_expect(fabsf(LK.loss - L1.loss) <= 2e-6f * fabsf(L1.loss), "%s K=%d: loss %.9g vs %.9g", model, Ks[k],
                  (double)LK.loss, (double)L1.loss);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (fabsf(LK.grads[i] - L1.grads[i]) > 1e-5f * fabsf(L1.grads[i]) + 1e-6f * (float)mx) {
                if (!bad) first = i;
                bad++;
            }
        cr_expect_eq(bad, 0, "%s K=%d: %zu gradients differ from K=1; first [%zu] %.9g vs %.9g", model, Ks[k], bad,
                     first, (double)LK.grads[first], (double)L1.grads[first]);
        fc_local_free(&LK);
    }
    // the same gradient from the double model on the same batch and weights
    dmodel d;
    memset(&d, 0, sizeof d);
    fc_model_build(&d.m, &c1.model);
    d.B = B;
    d.T = fc_model_has_tokens(&c1.model) ? T : 0;
    fc_batch_alloc(&d.batch, &c1.model, B, d.T);
    fc_data_fill(&d.batch, &c1.model, c1.seed, 0, 0);
    float *p0 = malloc(n * sizeof(float));
    fc_init_full(&d.m, c1.seed, p0);
    d.p = malloc(n * sizeof(double));
    d.g = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) d.p[i] = p0[i];
    d.act_mem = malloc(fc_acts_numel_f64(&d.m, B, d.T) * sizeof(double));
    fc_acts_init_f64(&d.acts, &d.m, B, d.T, d.act_mem);
    double ld = dgrad(&d);
    cr_expect(fabs(L1.loss - ld) <= 1e-5 * fabs(ld), "%s: local loss %.9g, double model %.12g", model,
              (double)L1.loss, ld);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += fabs(L1.grads[i] - d.g[i]) > 1e-4 * fabs(d.g[i]) + 1e-5 * mx;
    cr_expect_eq(bad, 0, "%s: %zu local gradients differ from the double model's", model, bad);
    free(p0);
    dmodel_free(&d);
    fc_local_free(&L1);
}

Test(local, grad_accum_identity_mlp) { check_grad_accum("mlp-tiny", 8, 0); }
Test(local, grad_accum_identity_gpt2) { check_grad_accum("gpt2-tiny", 8, 8); }
Test(local, grad_accum_identity_llama) { check_grad_accum("llama-tiny", 8, 8); }

Test(local, grad_norm_by_hand) {
    const float g[5] = {3.0f, -4.0f, 0.0f, 1e-3f, -0.5f};
    cr_expect(fabs(fc_grad_norm(g, 5, FC_NORM_1) - (3 + 4 + 1e-3 + 0.5)) < 1e-9);
    cr_expect(fabs(fc_grad_norm(g, 5, FC_NORM_2) - sqrt(9 + 16 + 1e-6 + 0.25)) < 1e-9);
    cr_expect_eq(fc_grad_norm(g, 5, FC_NORM_INF), 4.0);
    const float neg[2] = {-7.0f, 2.0f};
    cr_expect_eq(fc_grad_norm(neg, 2, FC_NORM_INF), 7.0, "inf norm takes |g|");
    cr_expect_eq(fc_grad_norm(g, 0, FC_NORM_2), 0.0);
}

// How many of after's parameters are not before's stepped by SGD (lr 1, no
// momentum) with gradient g, bit for bit.
static size_t stepped_with(const float *before, const float *g, const float *after, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float p = before[i] + -1.0f * g[i];
        bad += memcmp(&p, &after[i], sizeof p) != 0;
    }
    return bad;
}

// clip_grad_norm: coefficient max_norm / (total + 1e-6), clamped to 1. With a
// tiny max_norm the clipped gradient's norm is max_norm; with a large one the
// gradient is untouched; the optimizer steps with the clipped gradient.
static void check_clip(const char *model, int T, fc_norm_type nt) {
    const char *tn = fc_norm_name(nt);
    fc_run_config c = run_cfg(model, 8, T, 2);
    c.norm_type = nt;
    c.clip_grad_norm = 1e-3f;
    c.optim.kind = FC_OPT_SGD;  // p -= lr * clipped, exactly, without momentum
    c.optim.momentum = 0;
    c.optim.weight_decay = 0;
    c.optim.lr = 1.0;
    fc_local L;
    local_ok(&L, &c);
    size_t n = L.model.numel;
    float *before = malloc(n * sizeof(float));
    memcpy(before, L.params, n * sizeof(float));
    fc_local_step(&L);
    double total = fc_grad_norm(L.grads, n, nt);
    cr_expect_eq(L.grad_norm, total, "%s norm %s: reported %.17g, recomputed %.17g", model, tn, L.grad_norm, total);
    cr_expect_gt(total, 1e-2, "%s norm %s: the gradient norm %.3g is not above max_norm", model, tn, total);
    float coef = (float)(1e-3f / (total + 1e-6));
    float *clip = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) clip[i] = L.grads[i] * coef;
    double clipped = fc_grad_norm(clip, n, nt);
    cr_expect(fabs(clipped - 1e-3) <= 1e-5 * 1e-3, "%s norm %s: clipped norm %.9g, max_norm 1e-3", model, tn, clipped);
    cr_expect_eq(stepped_with(before, clip, L.params, n), 0,
                 "%s norm %s: parameters not stepped with the clipped gradient (grad * coef)", model, tn);
    fc_local_free(&L);

    // a large max_norm: no clipping
    c.clip_grad_norm = 1e6f;
    local_ok(&L, &c);
    memcpy(before, L.params, n * sizeof(float));
    fc_local_step(&L);
    cr_expect_eq(stepped_with(before, L.grads, L.params, n), 0, "%s norm %s: clipped although below max_norm", model,
                 tn);
    fc_local_free(&L);
    // and clipping off (0)
    c.clip_grad_norm = 0;
    local_ok(&L, &c);
    memcpy(before, L.params, n * sizeof(float));
    fc_local_step(&L);
    cr_expect_eq(stepped_with(before, L.grads, L.params, n), 0, "%s norm %s: clipped with clipping off", model, tn);
    fc_local_free(&L);
    free(clip);
    free(before);
}

Test(local, clip_grad_norm_l2) {
    check_clip("mlp-tiny", 0, FC_NORM_2);
    check_clip("gpt2-tiny", 8, FC_NORM_2);
}
Test(local, clip_grad_norm_l1) {
    check_clip("mlp-tiny", 0, FC_NORM_1);
    check_clip("gpt2-tiny", 8, FC_NORM_1);
}
Test(local, clip_grad_norm_inf) {
    check_clip("mlp-tiny", 0, FC_NORM_INF);
    check_clip("gpt2-tiny", 8, FC_NORM_INF);
}

// With HF init (std 0.02) the logits are ~0, so the loss is ~log(V).
Test(local, gpt2_loss_at_init_is_log_vocab) {
    fc_run_config c = run_cfg("gpt2-tiny", 8, 16, 1);
    fc_local L;
    local_ok(&L, &c);
    fc_local_step(&L);
    double want = log((double)c.model.vocab_size);
    cr_expect(fabs(L.loss - want) < 0.05, "gpt2-tiny: loss at init %.6f, log(V) = %.6f", (double)L.loss, want);
    fc_local_free(&L);

    fc_model_config c3 = gpt2_config("gpt2-L3", 23, 8, 12, 3, 3);
    dmodel d;
    dmodel_init(&d, &c3, 4, 8, 2, 1.0f);
    float *p0 = malloc(d.m.numel * sizeof(float));
    fc_init_full(&d.m, 2, p0);  // plain HF init, no perturbation
    for (size_t i = 0; i < d.m.numel; i++) d.p[i] = p0[i];
    free(p0);
    double l = dloss(&d);
    cr_expect(fabs(l - log(23.0)) < 0.05, "gpt2 L=3: loss at init %.6f, log(V) = %.6f", l, log(23.0));
    dmodel_free(&d);
}

// A few SGD/AdamW steps lower the loss on a fixed batch (sanity that the
// gradient has the right sign end to end).
Test(local, training_reduces_loss) {
    fc_run_config c = run_cfg("gpt2-tiny", 8, 8, 1);
    c.optim.lr = 1e-2;
    fc_local L;
    local_ok(&L, &c);
    // the same batch every step: force step 0's data by resetting L.step is
    // not allowed (it drives AdamW), so compare the loss on step 0's batch
    fc_model *m = &L.model;
    float *mem = malloc(fc_acts_numel(m, 8, 8) * sizeof(float));
    fc_acts a;
    fc_acts_init(&a, m, 8, 8, mem);
    fc_batch b;
    fc_batch_alloc(&b, &c.model, 8, 8);
    fc_data_fill(&b, &c.model, c.seed, 0, 0);
    float l0 = fc_model_forward(m, L.params, &b, &a);
    for (int s = 0; s < 5; s++) fc_local_step(&L);
    float l5 = fc_model_forward(m, L.params, &b, &a);
    cr_expect_lt(l5, l0 - 0.01f, "loss did not go down: %.6f -> %.6f", (double)l0, (double)l5);
    fc_batch_free(&b);
    free(mem);
    fc_local_free(&L);
}
