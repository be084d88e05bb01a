// tests/unit/test_config_model.c — presets, the parameter registry (names,
// shapes, units, offsets, stages), config.json parsing and refusals, and the
// run config's JSON round trip and world checks (docs/contract.md §2, §3, §5, §7).
//
// The expected names and shapes are written out here from docs/contract.md §2's table
// (Hugging Face GPT-2 names, Conv1D [in, out] layout; nn.Linear [out, in]),
// not derived from core/model.c.
#include <criterion/criterion.h>

#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "model.h"

static void load(const char *name, fc_model_config *c) {
    fc_error e;
    cr_assert_eq(fc_model_config_load(name, c, &e), 0, "%s: %s", name, e.msg);
}

// ---------------------------------------------------------------------------
// expected registries, from docs/contract.md §2

typedef struct {
    char name[96];
    int ndim;
    int64_t d0, d1;
    int unit;
} want_param;

static int push(want_param *w, int n, int unit, int64_t d0, int64_t d1, const char *fmt, int i) {
    snprintf(w[n].name, sizeof w[n].name, fmt, i);
    w[n].ndim = d1 ? 2 : 1;
    w[n].d0 = d0;
    w[n].d1 = d1;
    w[n].unit = unit;
    return n + 1;
}

// Registration (PyTorch module) order: wte, wpe, h.0 .. h.{L-1}, ln_f.
static int gpt2_expected(const fc_model_config *c, want_param *w) {
    int64_t V = c->vocab_size, P = c->n_positions, C = c->n_embd;
    int n = 0;
    n = push(w, n, 0, V, C, "transformer.wte.weight", 0);
    n = push(w, n, 0, P, C, "transformer.wpe.weight", 0);
    for (int i = 0; i < c->n_layer; i++) {
        int u = 1 + i;
        n = push(w, n, u, C, 0, "transformer.h.%d.ln_1.weight", i);
        n = push(w, n, u, C, 0, "transformer.h.%d.ln_1.bias", i);
        n = push(w, n, u, C, 3 * C, "transformer.h.%d.attn.c_attn.weight", i);
        n = push(w, n, u, 3 * C, 0, "transformer.h.%d.attn.c_attn.bias", i);
        n = push(w, n, u, C, C, "transformer.h.%d.attn.c_proj.weight", i);
        n = push(w, n, u, C, 0, "transformer.h.%d.attn.c_proj.bias", i);
        n = push(w, n, u, C, 0, "transformer.h.%d.ln_2.weight", i);
        n = push(w, n, u, C, 0, "transformer.h.%d.ln_2.bias", i);
        n = push(w, n, u, C, 4 * C, "transformer.h.%d.mlp.c_fc.weight", i);
        n = push(w, n, u, 4 * C, 0, "transformer.h.%d.mlp.c_fc.bias", i);
        n = push(w, n, u, 4 * C, C, "transformer.h.%d.mlp.c_proj.weight", i);
        n = push(w, n, u, C, 0, "transformer.h.%d.mlp.c_proj.bias", i);
    }
    n = push(w, n, 0, C, 0, "transformer.ln_f.weight", 0);
    n = push(w, n, 0, C, 0, "transformer.ln_f.bias", 0);
    return n;
}

// LlamaForCausalLM's registration order: embed_tokens, layers.0 .. L-1 (each:
// self_attn q k v o, mlp gate up down, input_layernorm,
// post_attention_layernorm), norm, lm_head (untied only). nn.Linear [out, in].
static int llama_expected(const fc_model_config *c, want_param *w) {
    int64_t V = c->vocab_size, C = c->n_embd, I = c->intermediate_size;
    int64_t Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_kv_head * c->head_dim;
    int n = 0;
    n = push(w, n, 0, V, C, "model.embed_tokens.weight", 0);
    for (int i = 0; i < c->n_layer; i++) {
        int u = 1 + i;
        n = push(w, n, u, Q, C, "model.layers.%d.self_attn.q_proj.weight", i);
        n = push(w, n, u, KV, C, "model.layers.%d.self_attn.k_proj.weight", i);
        n = push(w, n, u, KV, C, "model.layers.%d.self_attn.v_proj.weight", i);
        n = push(w, n, u, C, Q, "model.layers.%d.self_attn.o_proj.weight", i);
        n = push(w, n, u, I, C, "model.layers.%d.mlp.gate_proj.weight", i);
        n = push(w, n, u, I, C, "model.layers.%d.mlp.up_proj.weight", i);
        n = push(w, n, u, C, I, "model.layers.%d.mlp.down_proj.weight", i);
        n = push(w, n, u, C, 0, "model.layers.%d.input_layernorm.weight", i);
        n = push(w, n, u, C, 0, "model.layers.%d.post_attention_layernorm.weight", i);
    }
    n = push(w, n, 0, C, 0, "model.norm.weight", 0);
    if (!c->tie_word_embeddings) n = push(w, n, 0, V, C, "lm_head.weight", 0);
    return n;
}

static int mlp_expected(const fc_model_config *c, want_param *w) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        n = push(w, n, l, c->dims[l + 1], c->dims[l], "layers.%d.weight", l);
        n = push(w, n, l, c->dims[l + 1], 0, "layers.%d.bias", l);
    }
    return n;
}

static void check_registry(const fc_model *m, const want_param *w, int n) {
    cr_assert_eq(m->n_params, n, "%s: %d parameters, want %d", m->cfg.name, m->n_params, n);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const fc_param *p = &m->params[i];
        cr_expect_str_eq(p->name, w[i].name, "%s: parameter %d", m->cfg.name, i);
        cr_expect_eq(p->ndim, w[i].ndim, "%s: ndim", w[i].name);
        cr_expect_eq(p->shape[0], w[i].d0, "%s: shape[0] %lld, want %lld", w[i].name, (long long)p->shape[0],
                     (long long)w[i].d0);
        if (w[i].ndim == 2)
            cr_expect_eq(p->shape[1], w[i].d1, "%s: shape[1] %lld, want %lld", w[i].name,
                         (long long)p->shape[1], (long long)w[i].d1);
        size_t numel = (size_t)w[i].d0 * (size_t)(w[i].d1 ? w[i].d1 : 1);
        cr_expect_eq(p->numel, numel, "%s: numel", w[i].name);
        cr_expect_eq(p->unit, w[i].unit, "%s: unit %d, want %d", w[i].name, p->unit, w[i].unit);
        cr_expect_eq(fc_model_find(m, w[i].name), i, "%s: find", w[i].name);
        total += numel;
    }
    cr_expect_eq(m->numel, total, "%s: numel %zu, want %zu", m->cfg.name, m->numel, total);
}

Test(presets, gpt2_tiny_names_and_shapes) {
    fc_model_config c;
    load("gpt2-tiny", &c);
    cr_expect_eq(c.kind, FC_MODEL_GPT2);
    cr_expect_str_eq(c.name, "gpt2-tiny");
    cr_expect_eq(c.n_embd % c.n_head, 0);
    cr_expect_float_eq(c.layer_norm_epsilon, 1e-5f, 1e-12f);
    fc_model m;
    fc_model_build(&m, &c);
    want_param *w = calloc(4 + 12 * (size_t)c.n_layer, sizeof *w);
    int n = gpt2_expected(&c, w);
    check_registry(&m, w, n);
    // docs/contract.md §2: a few thousand to a few hundred thousand parameters
    cr_expect(m.numel >= 2000 && m.numel <= 500000, "gpt2-tiny has %zu parameters", m.numel);
    free(w);
    fc_model_free(&m);
}

// llama-micro: GQA 2:1, tied; llama-tiny: GQA 4:2, head_dim 6 != 16/4, untied.
Test(presets, llama_names_shapes_units) {
    const struct {
        const char *name;
        int V, C, L, H, KV, hd, I, tied;
        size_t root, layer;  // unit sizes
    } want[2] = {{"llama-micro", 13, 8, 1, 2, 1, 4, 12, 1, 13 * 8 + 8, 8 * 8 * 2 + 4 * 8 * 2 + 12 * 8 * 3 + 16},
                 {"llama-tiny", 97, 16, 2, 4, 2, 6, 40, 0, 2 * 97 * 16 + 16, 24 * 16 * 2 + 12 * 16 * 2 + 40 * 16 * 3 + 32}};
    for (int k = 0; k < 2; k++) {
        fc_model_config c;
        load(want[k].name, &c);
        cr_expect_eq(c.kind, FC_MODEL_LLAMA);
        cr_expect(c.vocab_size == want[k].V && c.n_embd == want[k].C && c.n_layer == want[k].L &&
                      c.n_head == want[k].H && c.n_kv_head == want[k].KV && c.head_dim == want[k].hd &&
                      c.intermediate_size == want[k].I && c.tie_word_embeddings == want[k].tied,
                  "%s: sizes", want[k].name);
        cr_expect(c.n_kv_head < c.n_head, "%s: grouped-query attention", want[k].name);
        cr_expect_float_eq(c.layer_norm_epsilon, 1e-6f, 1e-12f);  // LlamaConfig's rms_norm_eps
        cr_expect_eq(c.rope_theta, 10000.0);
        fc_model m;
        fc_model_build(&m, &c);
        want_param *w = calloc(4 + 9 * (size_t)c.n_layer, sizeof *w);
        check_registry(&m, w, llama_expected(&c, w));
        cr_expect_eq(m.n_units, 1 + c.n_layer);
        cr_expect_eq(m.root_unit, 0);
        cr_expect_eq(m.units[0].numel, want[k].root, "%s: root %zu", want[k].name, m.units[0].numel);
        for (int u = 1; u < m.n_units; u++) {
            cr_expect_eq(m.units[u].numel, want[k].layer, "%s: layer %d: %zu", want[k].name, u, m.units[u].numel);
            char unit[32];
            snprintf(unit, sizeof unit, "model.layers.%d", u - 1);
            cr_expect_str_eq(m.units[u].name, unit);
        }
        // stages: the embedding and the head on the root, one per layer between
        cr_expect_eq(m.n_stages, c.n_layer + 2);
        cr_expect(m.stages[0].kind == FC_STAGE_EMBED && m.stages[0].unit == 0);
        cr_expect(m.stages[m.n_stages - 1].kind == FC_STAGE_HEAD && m.stages[m.n_stages - 1].unit == 0);
        for (int l = 0; l < c.n_layer; l++)
            cr_expect(m.stages[1 + l].kind == FC_STAGE_BLOCK && m.stages[1 + l].unit == 1 + l);
        free(w);
        fc_model_free(&m);
    }
    // llama-tiny's layers (3104 = 2^5 * 97) shard unevenly at W = 3, 5, 6, 7
    fc_model_config t;
    load("llama-tiny", &t);
    fc_model m;
    fc_model_build(&m, &t);
    for (int W = 3; W <= 7; W++)
        if (W != 4) cr_expect(m.units[1].numel % (size_t)W != 0, "W=%d", W);
    fc_model_free(&m);
}

Test(presets, gpt2_124m_is_gpt2_small) {
    fc_model_config c;
    load("gpt2-124m", &c);
    cr_expect_eq(c.kind, FC_MODEL_GPT2);
    cr_expect_eq(c.vocab_size, 50257);
    cr_expect_eq(c.n_positions, 1024);
    cr_expect_eq(c.n_embd, 768);
    cr_expect_eq(c.n_layer, 12);
    cr_expect_eq(c.n_head, 12);
    cr_expect_float_eq(c.layer_norm_epsilon, 1e-5f, 1e-12f);
    fc_model m;
    fc_model_build(&m, &c);
    want_param *w = calloc(4 + 12 * 12, sizeof *w);
    int n = gpt2_expected(&c, w);
    cr_expect_eq(n, 148);
    check_registry(&m, w, n);
    cr_expect_eq(m.numel, (size_t)124439808, "gpt2-124m: %zu parameters, want 124,439,808", m.numel);
    free(w);
    fc_model_free(&m);
}

Test(presets, mlp_tiny_names_and_shapes) {
    fc_model_config c;
    load("mlp-tiny", &c);
    cr_expect_eq(c.kind, FC_MODEL_MLP);
    cr_expect_str_eq(c.name, "mlp-tiny");
    cr_expect_geq(c.n_layers, 2);
    cr_expect_geq(c.dims[c.n_layers], 2, "at least two classes");
    fc_model m;
    fc_model_build(&m, &c);
    want_param w[2 * FC_MLP_MAX_LAYERS];
    int n = mlp_expected(&c, w);
    check_registry(&m, w, n);
    cr_expect_eq(m.n_units, c.n_layers);
    fc_model_free(&m);
}

Test(presets, unknown_name_refused) {
    fc_model_config c;
    fc_error e;
    cr_expect_eq(fc_model_config_load("gpt2-huge", &c, &e), -1);
    cr_expect(strstr(e.msg, "gpt2-huge") != NULL, "message names the input: %s", e.msg);
    cr_expect(strstr(e.msg, "not a preset") != NULL, "message: %s", e.msg);
}

// ---------------------------------------------------------------------------
// units, offsets, stages

// Generic layout invariants: units tile the full buffer in order, each unit's
// parameters tile the unit in registration order, every parameter is in
// exactly one unit, and param.offset = unit.offset + param.unit_offset.
static void check_layout(const fc_model *m) {
    size_t off = 0;
    int *seen = calloc((size_t)m->n_params, sizeof(int));
    int k_total = 0;
    for (int u = 0; u < m->n_units; u++) {
        const fc_unit *U = &m->units[u];
        cr_expect_eq(U->offset, off, "%s unit %d offset %zu, want %zu", m->cfg.name, u, U->offset, off);
        cr_expect_eq(U->first_param, k_total, "%s unit %d first_param", m->cfg.name, u);
        size_t in_unit = 0;
        int prev = -1;
        for (int k = 0; k < U->n_params; k++) {
            int pi = m->unit_params[U->first_param + k];
            cr_assert(pi >= 0 && pi < m->n_params);
            const fc_param *p = &m->params[pi];
            seen[pi]++;
            cr_expect_eq(p->unit, u, "%s in unit %d says unit %d", p->name, u, p->unit);
            cr_expect_gt(pi, prev, "unit %d: %s out of registration order", u, p->name);
            prev = pi;
            cr_expect_eq(p->unit_offset, in_unit, "%s unit_offset %zu, want %zu", p->name, p->unit_offset, in_unit);
            cr_expect_eq(p->offset, U->offset + in_unit, "%s offset %zu, want %zu", p->name, p->offset,
                         U->offset + in_unit);
            in_unit += p->numel;
        }
        cr_expect_eq(U->numel, in_unit, "%s unit %d numel %zu, want %zu", m->cfg.name, u, U->numel, in_unit);
        off += in_unit;
        k_total += U->n_params;
    }
    cr_expect_eq(k_total, m->n_params);
    cr_expect_eq(m->numel, off, "%s: units cover %zu of %zu elements", m->cfg.name, off, m->numel);
    for (int i = 0; i < m->n_params; i++) cr_expect_eq(seen[i], 1, "%s in %d units", m->params[i].name, seen[i]);
    free(seen);
}

static const char *BLOCK_ORDER[12] = {"ln_1.weight",        "ln_1.bias",       "attn.c_attn.weight",
                                      "attn.c_attn.bias",   "attn.c_proj.weight", "attn.c_proj.bias",
                                      "ln_2.weight",        "ln_2.bias",       "mlp.c_fc.weight",
                                      "mlp.c_fc.bias",      "mlp.c_proj.weight", "mlp.c_proj.bias"};

static void check_gpt2_units(const char *preset) {
    fc_model_config c;
    load(preset, &c);
    fc_model m;
    fc_model_build(&m, &c);
    check_layout(&m);
    cr_assert_eq(m.n_units, 1 + c.n_layer);
    // root unit: wte, wpe, ln_f.weight, ln_f.bias, in that order
    const char *root[4] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                           "transformer.ln_f.bias"};
    cr_expect_str_eq(m.units[0].name, "");
    cr_assert_eq(m.units[0].n_params, 4);
    for (int k = 0; k < 4; k++)
        cr_expect_str_eq(m.params[m.unit_params[m.units[0].first_param + k]].name, root[k], "root unit param %d", k);
    size_t V = (size_t)c.vocab_size, P = (size_t)c.n_positions, C = (size_t)c.n_embd;
    cr_expect_eq(m.units[0].numel, V * C + P * C + 2 * C);
    cr_expect_eq(m.units[0].offset, 0);
    for (int i = 0; i < c.n_layer; i++) {
        const fc_unit *U = &m.units[1 + i];
        char want[96];
        snprintf(want, sizeof want, "transformer.h.%d", i);
        cr_expect_str_eq(U->name, want);
        cr_assert_eq(U->n_params, 12);
        for (int k = 0; k < 12; k++) {
            snprintf(want, sizeof want, "transformer.h.%d.%s", i, BLOCK_ORDER[k]);
            cr_expect_str_eq(m.params[m.unit_params[U->first_param + k]].name, want, "unit %d param %d", 1 + i, k);
        }
        cr_expect_eq(U->numel, 12 * C * C + 13 * C, "block %d numel", i);
    }
    // the block units follow the root in the full buffer
    cr_expect_eq(m.units[1].offset, m.units[0].numel);
    fc_model_free(&m);
}

Test(units, gpt2_tiny_units) { check_gpt2_units("gpt2-tiny"); }
Test(units, gpt2_124m_units) { check_gpt2_units("gpt2-124m"); }

Test(units, mlp_units) {
    fc_model_config c;
    load("mlp-tiny", &c);
    fc_model m;
    fc_model_build(&m, &c);
    check_layout(&m);
    for (int l = 0; l < c.n_layers; l++) {
        char want[64];
        snprintf(want, sizeof want, "layers.%d", l);
        cr_expect_str_eq(m.units[l].name, want);
        cr_assert_eq(m.units[l].n_params, 2);
        snprintf(want, sizeof want, "layers.%d.weight", l);
        cr_expect_str_eq(m.params[m.unit_params[m.units[l].first_param]].name, want);
        snprintf(want, sizeof want, "layers.%d.bias", l);
        cr_expect_str_eq(m.params[m.unit_params[m.units[l].first_param + 1]].name, want);
        cr_expect_eq(m.units[l].numel, (size_t)c.dims[l + 1] * (size_t)(c.dims[l] + 1));
    }
    fc_model_free(&m);
}

// docs/contract.md §2: pick sizes so that some units shard unevenly for W = 3, 5, 6, 7.
Test(units, tiny_presets_shard_unevenly) {
    const char *presets[2] = {"gpt2-tiny", "mlp-tiny"};
    const int Ws[4] = {3, 5, 6, 7};
    for (int k = 0; k < 2; k++) {
        fc_model_config c;
        load(presets[k], &c);
        fc_model m;
        fc_model_build(&m, &c);
        for (int wi = 0; wi < 4; wi++) {
            int uneven = 0;
            for (int u = 0; u < m.n_units; u++) uneven += m.units[u].numel % (size_t)Ws[wi] != 0;
            cr_expect_gt(uneven, 0, "%s: every unit divides evenly by W = %d", presets[k], Ws[wi]);
        }
        fc_model_free(&m);
    }
}

Test(stages, gpt2_order) {
    const char *presets[2] = {"gpt2-tiny", "gpt2-124m"};
    for (int k = 0; k < 2; k++) {
        fc_model_config c;
        load(presets[k], &c);
        fc_model m;
        fc_model_build(&m, &c);
        int L = c.n_layer;
        cr_assert_eq(m.n_stages, L + 2);
        cr_expect_eq(m.stages[0].kind, FC_STAGE_EMBED);
        cr_expect_eq(m.stages[0].unit, 0);
        for (int i = 0; i < L; i++) {
            cr_expect_eq(m.stages[1 + i].kind, FC_STAGE_BLOCK, "stage %d", 1 + i);
            cr_expect_eq(m.stages[1 + i].layer, i, "stage %d", 1 + i);
            cr_expect_eq(m.stages[1 + i].unit, 1 + i, "stage %d", 1 + i);
        }
        cr_expect_eq(m.stages[L + 1].kind, FC_STAGE_HEAD);
        cr_expect_eq(m.stages[L + 1].unit, 0);
        fc_model_free(&m);
    }
}

Test(stages, mlp_order) {
    fc_model_config c;
    load("mlp-tiny", &c);
    fc_model m;
    fc_model_build(&m, &c);
    cr_assert_eq(m.n_stages, c.n_layers);
    for (int l = 0; l < c.n_layers; l++) {
        cr_expect_eq(m.stages[l].kind, FC_STAGE_LINEAR);
        cr_expect_eq(m.stages[l].layer, l);
        cr_expect_eq(m.stages[l].unit, l);
    }
    fc_model_free(&m);
}

Test(registry, find_and_param_index) {
    fc_model_config c;
    load("gpt2-tiny", &c);
    fc_model m;
    fc_model_build(&m, &c);
    cr_expect_eq(fc_model_find(&m, "transformer.wte.weight"), 0);
    cr_expect_eq(fc_model_find(&m, "transformer.h.9.ln_1.weight"), -1);
    cr_expect_eq(fc_model_find(&m, "transformer.wte"), -1, "no prefix match");
    cr_expect_eq(fc_model_find(&m, ""), -1);
    cr_expect_eq(fc_model_find(&m, "lm_head.weight"), -1, "the tied head is not a separate parameter");
    int i = fc_model_param_index(&m, "transformer.h.%d.%s", 1, "mlp.c_fc.bias");
    cr_expect_str_eq(m.params[i].name, "transformer.h.1.mlp.c_fc.bias");
    fc_model_free(&m);
}

// A hand-filled config builds without a preset (used by the gradient tests).
Test(registry, custom_gpt2_config) {
    fc_model_config c;
    memset(&c, 0, sizeof c);
    c.kind = FC_MODEL_GPT2;
    snprintf(c.name, sizeof c.name, "custom");
    c.vocab_size = 23, c.n_positions = 7, c.n_embd = 12, c.n_layer = 3, c.n_head = 3;
    c.layer_norm_epsilon = 1e-5f;
    fc_error e;
    cr_assert_eq(fc_model_config_validate(&c, &e), 0, "%s", e.msg);
    fc_model m;
    fc_model_build(&m, &c);
    want_param w[4 + 12 * 3];
    int n = gpt2_expected(&c, w);
    check_registry(&m, w, n);
    check_layout(&m);
    fc_model_free(&m);
}

// ---------------------------------------------------------------------------
// config.json

// Writes text to a fresh temporary file; returns its path (static buffer per call site).
static void write_temp(char path[64], const char *text) {
    snprintf(path, 64, "/tmp/fc_test_config_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

// openai-community/gpt2's config.json, verbatim (minus task_specific_params).
static const char *HF_GPT2 =
    "{\n"
    "  \"activation_function\": \"gelu_new\",\n"
    "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
    "  \"attn_pdrop\": 0.1,\n"
    "  \"bos_token_id\": 50256,\n"
    "  \"embd_pdrop\": 0.1,\n"
    "  \"eos_token_id\": 50256,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"layer_norm_epsilon\": 1e-05,\n"
    "  \"model_type\": \"gpt2\",\n"
    "  \"n_ctx\": 1024,\n"
    "  \"n_embd\": 768,\n"
    "  \"n_head\": 12,\n"
    "  \"n_layer\": 12,\n"
    "  \"n_positions\": 1024,\n"
    "  \"resid_pdrop\": 0.1,\n"
    "  \"summary_activation\": null,\n"
    "  \"summary_first_dropout\": 0.1,\n"
    "  \"summary_proj_to_labels\": true,\n"
    "  \"summary_type\": \"cls_index\",\n"
    "  \"summary_use_proj\": true,\n"
    "  \"vocab_size\": 50257\n"
    "}\n";

Test(config_json, hf_gpt2_file) {
    char path[64];
    write_temp(path, HF_GPT2);
    fc_model_config c, p;
    load(path, &c);
    load("gpt2-124m", &p);
    unlink(path);
    cr_expect_eq(c.kind, FC_MODEL_GPT2);
    cr_expect_str_eq(c.name, path, "the name is the path it came from");
    cr_expect_eq(c.vocab_size, 50257);
    cr_expect_eq(c.n_positions, 1024);
    cr_expect_eq(c.n_embd, 768);
    cr_expect_eq(c.n_layer, 12);
    cr_expect_eq(c.n_head, 12);
    cr_expect_eq(c.layer_norm_epsilon, 1e-5f);
    // the same model as the preset
    fc_model a, b;
    fc_model_build(&a, &c);
    fc_model_build(&b, &p);
    cr_expect_eq(a.numel, b.numel);
    cr_expect_eq(a.n_params, b.n_params);
    fc_model_free(&a);
    fc_model_free(&b);
}

Test(config_json, small_gpt2_with_optional_keys) {
    const char *j = "{\"model_type\": \"gpt2\", \"vocab_size\": 101, \"n_positions\": 40, \"n_embd\": 24,"
                    " \"n_layer\": 3, \"n_head\": 6, \"layer_norm_epsilon\": 1e-6,"
                    " \"activation_function\": \"gelu_new\", \"n_inner\": null}";
    fc_model_config c;
    fc_error e;
    cr_assert_eq(fc_model_config_parse(j, "small.json", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.vocab_size, 101);
    cr_expect_eq(c.n_positions, 40);
    cr_expect_eq(c.n_embd, 24);
    cr_expect_eq(c.n_layer, 3);
    cr_expect_eq(c.n_head, 6);
    cr_expect_eq(c.layer_norm_epsilon, 1e-6f);
    cr_expect_str_eq(c.name, "small.json");
}

Test(config_json, gpt2_defaults_are_gpt2config) {
    fc_model_config c;
    fc_error e;
    cr_assert_eq(fc_model_config_parse("{\"model_type\": \"gpt2\"}", "d.json", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.vocab_size, 50257);
    cr_expect_eq(c.n_positions, 1024);
    cr_expect_eq(c.n_embd, 768);
    cr_expect_eq(c.n_layer, 12);
    cr_expect_eq(c.n_head, 12);
    cr_expect_eq(c.layer_norm_epsilon, 1e-5f);
}

Test(config_json, fsdpcheck_mlp_file) {
    char path[64];
    write_temp(path, "{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 9, 4, 3]}");
    fc_model_config c;
    load(path, &c);
    unlink(path);
    cr_expect_eq(c.kind, FC_MODEL_MLP);
    cr_expect_eq(c.n_layers, 3);
    cr_expect_eq(c.dims[0], 5);
    cr_expect_eq(c.dims[1], 9);
    cr_expect_eq(c.dims[2], 4);
    cr_expect_eq(c.dims[3], 3);
    fc_model m;
    fc_model_build(&m, &c);
    cr_expect_eq(m.numel, (size_t)(9 * 6 + 4 * 10 + 3 * 5));
    fc_model_free(&m);
}

typedef struct {
    const char *json;
    const char *substr;
} bad_case;

static void expect_refused(const char *json, const char *substr) {
    fc_model_config c;
    fc_error e;
    memset(&e, 0, sizeof e);
    int rc = fc_model_config_parse(json, "bad.json", &c, &e);
    cr_expect_eq(rc, -1, "accepted: %s", json);
    if (rc == -1) {
        cr_expect(strstr(e.msg, substr) != NULL, "%s\n  message \"%s\" lacks \"%s\"", json, e.msg, substr);
        cr_expect(strstr(e.msg, "bad.json") != NULL, "message \"%s\" does not name the file", e.msg);
    }
    // and the same through a file
    char path[64];
    write_temp(path, json);
    memset(&e, 0, sizeof e);
    rc = fc_model_config_load(path, &c, &e);
    cr_expect_eq(rc, -1, "file accepted: %s", json);
    if (rc == -1) cr_expect(strstr(e.msg, substr) != NULL, "file: message \"%s\" lacks \"%s\"", e.msg, substr);
    unlink(path);
}

Test(config_json, refusals) {
    static const bad_case cases[] = {
        {"{\"model_type\": \"gpt2\",", "not valid JSON"},
        {"", "not valid JSON"},
        {"not json at all", "not valid JSON"},
        {"[1, 2, 3]", "JSON object"},
        {"{\"vocab_size\": 100}", "missing \"model_type\""},
        {"{\"model_type\": 2}", "missing \"model_type\""},
        {"{\"model_type\": \"bert\"}", "unsupported \"model_type\": \"bert\""},
        {"{\"model_type\": \"gpt2\", \"n_embd\": 10, \"n_head\": 3}", "not divisible by n_head"},
        {"{\"model_type\": \"gpt2\", \"n_layer\": -2}", "\"n_layer\" must be a positive integer"},
        {"{\"model_type\": \"gpt2\", \"vocab_size\": 0}", "\"vocab_size\" must be a positive integer"},
        {"{\"model_type\": \"gpt2\", \"n_embd\": 64.5, \"n_head\": 1}", "\"n_embd\" must be a positive integer"},
        {"{\"model_type\": \"gpt2\", \"n_head\": 1.5}", "\"n_head\" must be a positive integer"},
        {"{\"model_type\": \"gpt2\", \"n_positions\": \"1024\"}", "\"n_positions\" must be a positive integer"},
        {"{\"model_type\": \"gpt2\", \"n_layer\": 1e12}", "\"n_layer\" must be a positive integer"},
        {"{\"model_type\": \"gpt2\", \"activation_function\": \"gelu\"}", "gelu_new"},
        {"{\"model_type\": \"gpt2\", \"activation_function\": \"relu\"}", "gelu_new"},
        {"{\"model_type\": \"gpt2\", \"activation_function\": 1}", "gelu_new"},
        {"{\"model_type\": \"gpt2\", \"n_inner\": 100}", "n_inner"},
        {"{\"model_type\": \"gpt2\", \"layer_norm_epsilon\": -1e-5}", "layer_norm_epsilon"},
        {"{\"model_type\": \"gpt2\", \"layer_norm_epsilon\": \"1e-5\"}", "layer_norm_epsilon"},
        {"{\"model_type\": \"fsdpcheck-mlp\"}", "\"dims\""},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5]}", "\"dims\""},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 0, 3]}", "\"dims\"[1]"},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, -4, 3]}", "\"dims\"[1]"},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 2.5, 3]}", "\"dims\"[1]"},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, \"4\"]}", "\"dims\"[1]"},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 1]}", "at least 2 classes"},
        // the whole file is one JSON value, and every key is given once
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 3]} }", "not valid JSON"},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 3]}\n{}", "not valid JSON"},
        {"{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_embd\": 32}", "key \"n_embd\" appears twice"},
        {"{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [5, 3], \"model_type\": \"gpt2\"}",
         "key \"model_type\" appears twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_refused(cases[i].json, cases[i].substr);
}

// SmolLM2-135M's config.json as users have it (examples/models/, a copy of
// the project's shared example): a 135M Llama, tied, GQA 9:3.
Test(config_json, llama_smollm2_135m_file) {
    fc_model_config c;
    load(FC_EXAMPLES_DIR "/models/llama.smollm2-135m.config.json", &c);
    cr_expect_eq(c.kind, FC_MODEL_LLAMA);
    cr_expect(c.vocab_size == 49152 && c.n_embd == 576 && c.n_layer == 30 && c.n_head == 9 && c.n_kv_head == 3 &&
              c.head_dim == 64 && c.intermediate_size == 1536 && c.n_positions == 8192);
    cr_expect(c.tie_word_embeddings);
    cr_expect_eq(c.layer_norm_epsilon, 1e-5f);
    cr_expect_eq(c.rope_theta, 100000.0);
    cr_expect_eq(c.initializer_range, (float)0.041666666666666664);
    fc_model m;
    fc_model_build(&m, &c);
    // 134,515,008: SmolLM2-135M's parameter count (the tied head counted once)
    cr_expect_eq(m.numel, 134515008u, "%zu parameters", m.numel);
    fc_model_free(&m);
}

// LlamaConfig's defaults for omitted keys, transformers 5's rope_parameters
Test(config_json, llama_defaults_and_rope_parameters) {
    fc_model_config c;
    fc_error e;
    const char *j = "{\"model_type\": \"llama\", \"vocab_size\": 50, \"hidden_size\": 32, \"intermediate_size\": 64,"
                    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": null,"
                    " \"head_dim\": null, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0}}";
    cr_assert_eq(fc_model_config_parse(j, "t.json", &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.n_kv_head, 4);   // null: num_attention_heads
    cr_expect_eq(c.head_dim, 8);    // null: hidden_size / num_attention_heads
    cr_expect_eq(c.rope_theta, 500000.0);
    cr_expect_eq(c.layer_norm_epsilon, 1e-6f);
    cr_expect_eq(c.initializer_range, 0.02f);
    cr_expect_eq(c.tie_word_embeddings, 0);  // LlamaConfig's default
    cr_expect_eq(c.n_positions, 2048);
}

Test(config_json, llama_refusals) {
    static const bad_case cases[] = {
        {"{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", "\"hidden_act\": \"silu\""},
        {"{\"model_type\": \"llama\", \"attention_bias\": true}", "\"attention_bias\": false"},
        {"{\"model_type\": \"llama\", \"mlp_bias\": true}", "\"mlp_bias\": false"},
        {"{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\"}}", "\"rope_scaling\": null"},
        {"{\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"yarn\"}}", "rope_type"},
        {"{\"model_type\": \"llama\", \"attention_dropout\": 0.1}", "attention_dropout"},
        {"{\"model_type\": \"llama\", \"pretraining_tp\": 2}", "pretraining_tp"},
        {"{\"model_type\": \"llama\", \"tie_word_embeddings\": 1}", "true or false"},
        {"{\"model_type\": \"llama\", \"num_attention_heads\": 6, \"num_key_value_heads\": 4}",
         "not divisible by num_key_value_heads"},
        {"{\"model_type\": \"llama\", \"head_dim\": 7}", "head_dim 7 is odd"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 4, \"num_attention_heads\": 8}", "head_dim >= 1"},
        {"{\"model_type\": \"llama\", \"rms_norm_eps\": 0}", "rms_norm_eps"},
        {"{\"model_type\": \"llama\", \"rope_theta\": -1}", "rope_theta"},
        {"{\"model_type\": \"llama\", \"num_key_value_heads\": 0}", "num_key_value_heads"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 16384, \"num_attention_heads\": 128}",
         "too large"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_refused(cases[i].json, cases[i].substr);
}

Test(config_json, nonexistent_file) {
    fc_model_config c;
    fc_error e;
    const char *path = "/nonexistent/dir/config.json";
    cr_expect_eq(fc_model_config_load(path, &c, &e), -1);
    cr_expect(strstr(e.msg, "cannot open") != NULL, "message: %s", e.msg);
    cr_expect(strstr(e.msg, path) != NULL, "message names the path: %s", e.msg);
}

// A rope_theta of 17 significant digits: cJSON writes 15 where they read back
// within an ulp, so the config takes the value as written (fuzz.config found the
// round trip one ulp off). Parsed once, the model is a fixed point of its JSON.
Test(config_json, a_17_digit_rope_theta_round_trips) {
    const char *text = "{\"model_type\": \"llama\", \"rope_theta\": 9999999.999999999}";
    fc_model_config a, b;
    fc_error e;
    cr_assert_eq(fc_model_config_parse(text, "config.json", &a, &e), 0, "%s", e.msg);
    cJSON *j = fc_model_config_to_json(&a);
    char *again = cJSON_PrintUnformatted(j);
    cr_assert_eq(fc_model_config_parse(again, "round-trip", &b, &e), 0, "%s", e.msg);
    cr_expect(fc_model_config_equal(&a, &b), "rope_theta %.17g became %.17g", a.rope_theta, b.rope_theta);
    cr_expect_eq(a.rope_theta, 1e7, "%.17g", a.rope_theta);  // what cJSON writes: 10000000
    free(again);
    cJSON_Delete(j);
}

// fc_model_config_to_json's output parses back into the same model.
Test(config_json, model_to_json_round_trip) {
    const char *presets[5] = {"mlp-tiny", "gpt2-tiny", "gpt2-124m", "llama-micro", "llama-tiny"};
    for (int k = 0; k < 5; k++) {
        fc_model_config a, b;
        load(presets[k], &a);
        cJSON *j = fc_model_config_to_json(&a);
        char *text = cJSON_PrintUnformatted(j);
        fc_error e;
        cr_assert_eq(fc_model_config_parse(text, presets[k], &b, &e), 0, "%s: %s\n%s", presets[k], e.msg, text);
        cr_expect(memcmp(&a, &b, sizeof a) == 0, "%s: config changed through JSON: %s", presets[k], text);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "fsdpcheck_name");
        cr_expect(cJSON_IsString(name) && strcmp(name->valuestring, presets[k]) == 0);
        if (a.kind == FC_MODEL_GPT2) {
            // enough for transformers' from_pretrained
            const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
            cr_expect(cJSON_IsString(mt) && strcmp(mt->valuestring, "gpt2") == 0);
            cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")));
            const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
            cr_expect(cJSON_IsString(act) && strcmp(act->valuestring, "gelu_new") == 0);
        }
        if (a.kind == FC_MODEL_LLAMA) {
            const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0);
            cr_expect(cJSON_IsString(arch) && strcmp(arch->valuestring, "LlamaForCausalLM") == 0);
            cr_expect(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")));
            cr_expect(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "head_dim")));
        }
        free(text);
        cJSON_Delete(j);
    }
}

// ---------------------------------------------------------------------------
// run config

static void expect_run_configs_equal(const fc_run_config *a, const fc_run_config *b) {
    cr_expect(memcmp(&a->model, &b->model, sizeof a->model) == 0, "model config differs");
    cr_expect_str_eq(a->impl, b->impl);
    cr_expect_eq(a->strategy, b->strategy);
    cr_expect_eq(a->fsdp_version, b->fsdp_version);
    cr_expect_eq(a->shard_group, b->shard_group);
    cr_expect_eq(a->backward_prefetch, b->backward_prefetch);
    cr_expect_eq(a->forward_prefetch, b->forward_prefetch);
    cr_expect_eq(a->backward_prefetch_depth, b->backward_prefetch_depth);
    cr_expect_eq(a->gradient_divide_factor, b->gradient_divide_factor, "divide factor %.17g vs %.17g",
                 a->gradient_divide_factor, b->gradient_divide_factor);
    cr_expect_eq(a->limit_all_gathers, b->limit_all_gathers);
    cr_expect_eq(a->param_dtype, b->param_dtype);
    cr_expect_eq(a->reduce_dtype, b->reduce_dtype);
    cr_expect_eq(a->divide, b->divide);
    cr_expect_eq(a->grad_accum, b->grad_accum);
    cr_expect_eq(a->no_sync, b->no_sync);
    cr_expect_eq(a->clip_grad_norm, b->clip_grad_norm, "clip %.9g vs %.9g", (double)a->clip_grad_norm,
                 (double)b->clip_grad_norm);
    cr_expect_eq(a->norm_type, b->norm_type);
    cr_expect_eq(a->cpu_offload, b->cpu_offload);
    cr_expect_eq(a->optim.kind, b->optim.kind);
    cr_expect_eq(a->optim.lr, b->optim.lr, "lr %.17g vs %.17g", a->optim.lr, b->optim.lr);
    cr_expect_eq(a->optim.weight_decay, b->optim.weight_decay);
    cr_expect_eq(a->optim.beta1, b->optim.beta1);
    cr_expect_eq(a->optim.beta2, b->optim.beta2);
    cr_expect_eq(a->optim.eps, b->optim.eps);
    cr_expect_eq(a->optim.momentum, b->optim.momentum);
    cr_expect_eq(a->optim.dampening, b->optim.dampening);
    cr_expect_eq(a->optim.nesterov, b->optim.nesterov);
    cr_expect_eq(a->steps, b->steps);
    cr_expect_eq(a->global_batch, b->global_batch);
    cr_expect_eq(a->seq_len, b->seq_len);
    cr_expect_eq(a->seed, b->seed, "seed %llu vs %llu", (unsigned long long)a->seed, (unsigned long long)b->seed);
    cr_expect_str_eq(a->init_path, b->init_path);
}

static void round_trip(const fc_run_config *a) {
    fc_error e;
    cr_assert_eq(fc_run_config_validate(a, &e), 0, "%s", e.msg);
    cJSON *j = fc_run_config_to_json(a);
    // through text, as trace.json and checkpoints store it
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    cJSON *k = cJSON_Parse(text);
    cr_assert_not_null(k, "%s", text);
    fc_run_config b;
    cr_assert_eq(fc_run_config_from_json(k, &b, &e), 0, "%s\n%s", e.msg, text);
    expect_run_configs_equal(a, &b);
    cJSON_Delete(k);
    free(text);
}

Test(run_config, defaults_round_trip) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    fc_error e;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);
    cr_expect_eq(a.grad_accum, 1);
    cr_expect_eq(a.optim.kind, FC_OPT_ADAMW);
    cr_expect_eq(a.optim.beta1, 0.9);
    cr_expect_eq(a.optim.beta2, 0.999);
    cr_expect_eq(a.optim.eps, 1e-8);
    round_trip(&a);
}

Test(run_config, everything_changed_round_trip) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    load("gpt2-tiny", &a.model);
    snprintf(a.impl, sizeof a.impl, "./libmyport.so");
    a.strategy = FC_STRATEGY_HYBRID_SHARD_ZERO2;
    a.shard_group = 2;
    a.backward_prefetch = FC_PREFETCH_POST;
    a.forward_prefetch = 1;
    a.limit_all_gathers = 1;
    a.param_dtype = FC_PREC_BF16;
    a.reduce_dtype = FC_PREC_FP16;
    a.divide = FC_DIVIDE_SUM_THEN_DIVIDE;
    a.grad_accum = 4;
    a.no_sync = 1;
    a.clip_grad_norm = 0.37f;
    a.norm_type = FC_NORM_INF;
    a.cpu_offload = 1;
    a.optim.kind = FC_OPT_SGD;
    a.optim.lr = 0.1 / 3.0;  // needs all 17 digits
    a.optim.weight_decay = 1e-4;
    a.optim.momentum = 0.85;
    a.optim.dampening = 0.0;
    a.optim.nesterov = 1;
    a.optim.beta1 = 0.7;
    a.optim.beta2 = 0.95;
    a.optim.eps = 3e-7;
    a.steps = 17;
    a.global_batch = 48;
    a.seq_len = 31;
    a.seed = 18446744073709551615ull;  // all 64 bits: a JSON double would lose them
    snprintf(a.init_path, sizeof a.init_path, "/data/init weights.safetensors");
    round_trip(&a);
    // seeds one apart at the top of the range stay apart
    a.seed = 18446744073709551614ull;
    round_trip(&a);
    a.seed = 9007199254740993ull;  // 2^53 + 1
    round_trip(&a);
}

// FSDP2's explicit prefetch lists and divide factor: written only when set,
// read back as set; a config without them (an older trace) reads as unset
Test(run_config, fsdp2_lists_and_divide_factor_round_trip) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    load("gpt2-tiny", &a.model);
    a.strategy = FC_STRATEGY_FULL_SHARD;
    a.fsdp_version = 2;
    a.forward_prefetch = 3;
    a.backward_prefetch_depth = 2;
    a.gradient_divide_factor = 8.0 / 3.0;  // a factor scaled by W' / W: all 17 digits
    round_trip(&a);
    a.forward_prefetch = 1;
    a.backward_prefetch_depth = 1;
    a.gradient_divide_factor = 1;
    round_trip(&a);
    a.forward_prefetch = a.backward_prefetch_depth = 0;
    a.gradient_divide_factor = 0;
    cJSON *j = fc_run_config_to_json(&a);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "forward_prefetch_units"));
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "backward_prefetch_units"));
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "gradient_divide_factor"));
    cJSON_Delete(j);
    round_trip(&a);
}

// What FSDP1 has no counterpart of, and factors that are no factor, are refused
Test(run_config, fsdp2_lists_and_divide_factor_refusals) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    a.strategy = FC_STRATEGY_FULL_SHARD;
    fc_error e;
    a.forward_prefetch = 2;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "FSDP1's forward_prefetch prefetches one unit"), "%s", e.msg);
    a.forward_prefetch = 0;
    a.backward_prefetch_depth = 2;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "set_modules_to_backward_prefetch"), "%s", e.msg);
    a.backward_prefetch_depth = 0;
    a.fsdp_version = 2;
    const double bad[] = {-1, INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        a.gradient_divide_factor = bad[i];
        cr_expect_eq(fc_run_config_validate(&a, &e), -1, "factor %g accepted", bad[i]);
        cr_expect(strstr(e.msg, "--gradient-divide-factor"), "%s", e.msg);
    }
    a.gradient_divide_factor = 3;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);
    a.fsdp_version = 1;  // FSDP1 has no setter; its DDP (no_shard) keeps the factor an FSDP2 run is judged with
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "set_gradient_divide_factor"), "%s", e.msg);
    a.strategy = FC_STRATEGY_NO_SHARD;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);
}

Test(run_config, mlp_and_custom_model_round_trip) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    cr_expect_eq(a.model.kind, FC_MODEL_MLP);
    a.optim.kind = FC_OPT_ADAMW;
    a.optim.lr = 3e-4;
    a.seed = 0;
    round_trip(&a);
    fc_error e;
    const char *j = "{\"model_type\": \"gpt2\", \"vocab_size\": 101, \"n_positions\": 40, \"n_embd\": 24,"
                    " \"n_layer\": 3, \"n_head\": 6, \"layer_norm_epsilon\": 1e-6}";
    cr_assert_eq(fc_model_config_parse(j, "my-config.json", &a.model, &e), 0, "%s", e.msg);
    a.seq_len = 40;
    round_trip(&a);
}

static void expect_from_json_refused(const char *mutate_key, cJSON *value, const char *substr) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    cJSON *j = fc_run_config_to_json(&a);
    if (value)
        cJSON_ReplaceItemInObjectCaseSensitive(j, mutate_key, value);
    else
        cJSON_DeleteItemFromObjectCaseSensitive(j, mutate_key);
    fc_run_config b;
    fc_error e;
    cr_expect_eq(fc_run_config_from_json(j, &b, &e), -1, "%s: accepted", mutate_key);
    cr_expect(strstr(e.msg, substr) != NULL, "%s: message \"%s\" lacks \"%s\"", mutate_key, e.msg, substr);
    cJSON_Delete(j);
}

Test(run_config, from_json_refusals) {
    expect_from_json_refused("seed", cJSON_CreateNumber(1234), "seed");
    expect_from_json_refused("seed", cJSON_CreateString("-1"), "seed");
    expect_from_json_refused("seed", cJSON_CreateString("18446744073709551616"), "seed");
    expect_from_json_refused("seed", cJSON_CreateString("12x"), "seed");
    expect_from_json_refused("seed", cJSON_CreateString(""), "seed");
    expect_from_json_refused("strategy", cJSON_CreateString("zero3"), "strategy");
    expect_from_json_refused("norm_type", cJSON_CreateString("3"), "norm_type");
    expect_from_json_refused("optimizer", NULL, "optimizer");
    expect_from_json_refused("model", NULL, "model");
    expect_from_json_refused("grad_accum", cJSON_CreateNumber(1.5), "grad_accum");
    expect_from_json_refused("no_sync", cJSON_CreateNumber(1), "no_sync");
    expect_from_json_refused("steps", cJSON_CreateNumber(0), "steps");
    fc_run_config b;
    fc_error e;
    cJSON *arr = cJSON_CreateArray();
    cr_expect_eq(fc_run_config_from_json(arr, &b, &e), -1);
    cJSON_Delete(arr);
}

// FSDP2's run config: fsdp_version travels in trace.json; a config written
// before it (no key) reads as FSDP1.
Test(run_config, fsdp2_round_trip) {
    fc_run_config a;
    fc_run_config_defaults(&a);
    load("gpt2-tiny", &a.model);
    a.strategy = FC_STRATEGY_SHARD_GRAD_OP;
    a.fsdp_version = 2;
    a.divide = FC_DIVIDE_AVG;
    round_trip(&a);
    cJSON *j = fc_run_config_to_json(&a);
    cJSON_DeleteItemFromObject(j, "fsdp_version");
    fc_run_config b;
    fc_error e;
    cr_assert_eq(fc_run_config_from_json(j, &b, &e), 0, "%s", e.msg);
    cr_expect_eq(b.fsdp_version, 1);
    cJSON_Delete(j);
}

// fc_run_config_validate refuses a, with frag in its one line.
static void expect_run_refused(const fc_run_config *a, const char *frag) {
    fc_error e;
    cr_expect_eq(fc_run_config_validate(a, &e), -1, "accepted; expected a refusal naming %s", frag);
    cr_expect(strstr(e.msg, frag) != NULL, "%s", e.msg);
}

// A fault that would change nothing in a model is refused there: tied_untied
// needs a tied head, rope_half rotary embeddings.
Test(run_config, model_faults_need_their_model) {
    fc_run_config a;
    fc_error e;
    fc_run_config_defaults(&a);
    a.strategy = FC_STRATEGY_FULL_SHARD;
    a.inject = FC_FAULT_TIED_UNTIED;
    expect_run_refused(&a, "--inject tied_untied needs a tied LM head");  // mlp-tiny
    cr_assert_eq(fc_model_config_load("llama-tiny", &a.model, &e), 0);
    expect_run_refused(&a, "model llama-tiny has none");                  // untied
    cr_assert_eq(fc_model_config_load("llama-micro", &a.model, &e), 0);
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);        // tied
    a.inject = FC_FAULT_ROPE_HALF;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &a.model, &e), 0);
    expect_run_refused(&a, "--inject rope_half needs a llama model");
    a.inject = FC_FAULT_TIED_UNTIED;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);
}

// FSDP2 needs a sharded strategy and refuses FSDP1's prefetch options and
// the faults of FSDP1's layout (fc_fault_versions); FSDP1 refuses FSDP2's.
Test(run_config, fsdp2_refusals) {
    fc_run_config a, b;
    fc_error e;
    fc_run_config_defaults(&a);
    a.fsdp_version = 2;
    expect_run_refused(&a, "sharded strategy");  // local
    a.strategy = FC_STRATEGY_NO_SHARD;
    expect_run_refused(&a, "FSDP2 has no no_shard");
    a.strategy = FC_STRATEGY_FULL_SHARD;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);
    b = a, b.backward_prefetch = FC_PREFETCH_POST;
    expect_run_refused(&b, "--backward-prefetch is an FSDP1 option");
    b = a, b.forward_prefetch = 1;  // FSDP2's explicit forward prefetch list (the next unit)
    cr_expect_eq(fc_run_config_validate(&b, &e), 0, "%s", e.msg);
    b.limit_all_gathers = 1;
    expect_run_refused(&b, "--limit-all-gathers is an FSDP1 option");
    b = a, b.inject = FC_FAULT_PADDING_LEAK;  // a fault of FSDP1's flat chunks
    expect_run_refused(&b, "--inject padding_leak is a fault of FSDP1's layout");
    b = a, b.inject = FC_FAULT_NO_DIVIDE;  // in no layout: both versions
    cr_expect_eq(fc_run_config_validate(&b, &e), 0, "%s", e.msg);
    b.inject = FC_FAULT_CKPT_SWAP;
    cr_expect_eq(fc_run_config_validate(&b, &e), 0, "%s", e.msg);
    b = a, b.inject = FC_FAULT_FSDP2_EVEN_ROWS;
    cr_expect_eq(fc_run_config_validate(&b, &e), 0, "%s", e.msg);
    b.inject = FC_FAULT_RECOMPUTE_DTYPE;  // in no layout: both versions
    cr_expect_eq(fc_run_config_validate(&b, &e), 0, "%s", e.msg);
    b = a, b.fsdp_version = 1, b.inject = FC_FAULT_FSDP2_AVG_TWICE;
    expect_run_refused(&b, "--inject fsdp2_avg_twice is a fault of FSDP2's layout");
    b.inject = FC_FAULT_DCP_SAVED_OFFSETS;
    expect_run_refused(&b, "--inject dcp_saved_offsets is a fault of FSDP2's layout");
    b = a, b.fsdp_version = 3;
    expect_run_refused(&b, "--fsdp-version 3");
}

Test(run_config, validate_refusals) {
    fc_run_config a;
    fc_error e;
    fc_run_config_defaults(&a);
    load("gpt2-tiny", &a.model);
    a.seq_len = a.model.n_positions + 1;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "--seq-len") != NULL, "%s", e.msg);
    a.seq_len = a.model.n_positions;
    cr_expect_eq(fc_run_config_validate(&a, &e), 0, "%s", e.msg);

    fc_run_config_defaults(&a);
    a.no_sync = 1;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "--no-sync") != NULL, "%s", e.msg);

    fc_run_config_defaults(&a);
    a.optim.kind = FC_OPT_SGD;
    a.optim.nesterov = 1;
    a.optim.dampening = 0.1;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "Nesterov") != NULL, "%s", e.msg);

    fc_run_config_defaults(&a);
    a.optim.beta2 = 1.0;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "betas") != NULL, "%s", e.msg);

    fc_run_config_defaults(&a);
    a.global_batch = 0;
    cr_expect_eq(fc_run_config_validate(&a, &e), -1);
    cr_expect(strstr(e.msg, "--global-batch") != NULL, "%s", e.msg);
}

Test(run_config, validate_world) {
    fc_run_config a;
    fc_error e;
    fc_run_config_defaults(&a);
    a.strategy = FC_STRATEGY_FULL_SHARD;
    a.global_batch = 24;
    for (int W = 1; W <= 8; W++) {
        int rc = fc_run_config_validate_world(&a, W, &e);
        if (24 % W == 0)
            cr_expect_eq(rc, 0, "B 24 W %d: %s", W, e.msg);
        else {
            cr_expect_eq(rc, -1, "B 24 at W %d accepted", W);
            cr_expect(strstr(e.msg, "--global-batch 24 is not divisible by the data-parallel size") != NULL,
                      "W %d: %s", W, e.msg);
        }
    }
    // shard group must divide W
    a.global_batch = 24;
    a.strategy = FC_STRATEGY_HYBRID_SHARD;
    a.shard_group = 3;
    cr_expect_eq(fc_run_config_validate_world(&a, 4, &e), -1);
    cr_expect(strstr(e.msg, "--shard-group 3 does not divide the world size 4") != NULL, "%s", e.msg);
    cr_expect_eq(fc_run_config_validate_world(&a, 6, &e), 0, "%s", e.msg);
    a.shard_group = 8;
    cr_expect_eq(fc_run_config_validate_world(&a, 4, &e), -1, "shard group larger than the world");
    cr_expect(strstr(e.msg, "--shard-group") != NULL, "%s", e.msg);
    a.shard_group = 0;
    cr_expect_eq(fc_run_config_validate_world(&a, 4, &e), 0, "%s", e.msg);
    // per-rank batch must split into K micro-batches
    a.strategy = FC_STRATEGY_NO_SHARD;
    a.global_batch = 8;
    a.grad_accum = 3;
    cr_expect_eq(fc_run_config_validate_world(&a, 2, &e), -1);
    cr_expect(strstr(e.msg, "per-rank batch 4 is not divisible by --grad-accum 3") != NULL, "%s", e.msg);
    a.grad_accum = 4;
    cr_expect_eq(fc_run_config_validate_world(&a, 2, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_run_config_validate_world(&a, 4, &e), -1, "per-rank batch 2 with K 4");
    // local runs as one process
    a.strategy = FC_STRATEGY_LOCAL;
    a.grad_accum = 1;
    cr_expect_eq(fc_run_config_validate_world(&a, 1, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_run_config_validate_world(&a, 2, &e), -1);
    cr_expect(strstr(e.msg, "local") != NULL, "%s", e.msg);
}

Test(run_config, enum_names) {
    const char *strategies[6] = {"local", "no_shard", "full_shard", "shard_grad_op", "hybrid_shard",
                                 "hybrid_shard_zero2"};
    for (int i = 0; i < 6; i++) {
        fc_strategy s;
        cr_expect_eq(fc_strategy_parse(strategies[i], &s), 0, "%s", strategies[i]);
        cr_expect_eq((int)s, i);
        cr_expect_str_eq(fc_strategy_name((fc_strategy)i), strategies[i]);
    }
    fc_strategy s;
    cr_expect_eq(fc_strategy_parse("FULL_SHARD", &s), -1);
    cr_expect_eq(fc_strategy_parse(NULL, &s), -1);
    const char *prefetch[3] = {"none", "pre", "post"};
    for (int i = 0; i < 3; i++) {
        fc_prefetch p;
        cr_expect_eq(fc_prefetch_parse(prefetch[i], &p), 0);
        cr_expect_str_eq(fc_prefetch_name(p), prefetch[i]);
    }
    const char *norms[3] = {"1", "2", "inf"};
    const fc_norm_type nt[3] = {FC_NORM_1, FC_NORM_2, FC_NORM_INF};
    for (int i = 0; i < 3; i++) {
        fc_norm_type n;
        cr_expect_eq(fc_norm_parse(norms[i], &n), 0);
        cr_expect_eq(n, nt[i]);
    }
    fc_opt_kind o;
    cr_expect_eq(fc_opt_parse("adamw", &o), 0);
    cr_expect_eq(o, FC_OPT_ADAMW);
    cr_expect_eq(fc_opt_parse("sgd", &o), 0);
    cr_expect_eq(o, FC_OPT_SGD);
    cr_expect_eq(fc_opt_parse("adam", &o), -1);
    fc_divide d;
    cr_expect_eq(fc_divide_parse("avg", &d), 0);
    cr_expect_eq(d, FC_DIVIDE_AVG);
    cr_expect_eq(fc_divide_parse("sum-then-divide", &d), 0);
    cr_expect_eq(d, FC_DIVIDE_SUM_THEN_DIVIDE);
}
