// core/model.c — builds the parameter registry, see model.h.
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Registration in PyTorch module order; the unit is chosen by the caller.
static void add_param(fc_model *m, int cap, int unit, fc_init_kind init, float scale,
                      int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static void add_param(fc_model *m, int cap, int unit, fc_init_kind init, float scale,
                      int64_t d0, int64_t d1, const char *fmt, ...) {
    if (m->n_params >= cap) fc_die(FC_EXIT_INTERNAL, "%s:%d: parameter table overflow", __FILE__, __LINE__);
    fc_param *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    p->unit = unit;
    p->init = init;
    p->init_scale = scale;
}

static void build_mlp(fc_model *m, int cap) {
    const fc_model_config *c = &m->cfg;
    m->n_units = c->n_layers;
    m->units = callocCheck((size_t)m->n_units, sizeof(fc_unit));
    m->n_stages = c->n_layers;
    m->stages = callocCheck((size_t)m->n_stages, sizeof(fc_stage));
    for (int l = 0; l < c->n_layers; l++) {
        int in = c->dims[l], out = c->dims[l + 1];
        // nn.Linear's default init: kaiming_uniform(a=sqrt(5)) for the weight,
        // which is U(-1/sqrt(in), 1/sqrt(in)), and the same bound for the bias.
        float bound = 1.0f / sqrtf((float)in);
        snprintf(m->units[l].name, sizeof m->units[l].name, "layers.%d", l);
        add_param(m, cap, l, FC_INIT_UNIFORM, bound, out, in, "layers.%d.weight", l);
        add_param(m, cap, l, FC_INIT_UNIFORM, bound, out, 0, "layers.%d.bias", l);
        m->stages[l] = (fc_stage){FC_STAGE_LINEAR, l, l};
    }
}

static void build_gpt2(fc_model *m, int cap) {
    const fc_model_config *c = &m->cfg;
    int V = c->vocab_size, P = c->n_positions, C = c->n_embd, L = c->n_layer;
    // Unit 0 is the root (wte, wpe, ln_f); unit 1 + i is transformer.h.i.
    m->n_units = 1 + L;
    m->units = callocCheck((size_t)m->n_units, sizeof(fc_unit));
    snprintf(m->units[0].name, sizeof m->units[0].name, "%s", "");
    m->n_stages = L + 2;
    m->stages = callocCheck((size_t)m->n_stages, sizeof(fc_stage));
    // Hugging Face GPT2PreTrainedModel._init_weights: normal(0, 0.02) for
    // Linear/Conv1D/Embedding weights, zero biases, LayerNorm weight 1 bias 0,
    // and c_proj weights normal(0, 0.02 / sqrt(2 * n_layer)).
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    add_param(m, cap, 0, FC_INIT_NORMAL, std, V, C, "transformer.wte.weight");
    add_param(m, cap, 0, FC_INIT_NORMAL, std, P, C, "transformer.wpe.weight");
    for (int i = 0; i < L; i++) {
        int u = 1 + i;
        snprintf(m->units[u].name, sizeof m->units[u].name, "transformer.h.%d", i);
        add_param(m, cap, u, FC_INIT_ONES, 0, C, 0, "transformer.h.%d.ln_1.weight", i);
        add_param(m, cap, u, FC_INIT_ZEROS, 0, C, 0, "transformer.h.%d.ln_1.bias", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, C, 3 * C, "transformer.h.%d.attn.c_attn.weight", i);
        add_param(m, cap, u, FC_INIT_ZEROS, 0, 3 * C, 0, "transformer.h.%d.attn.c_attn.bias", i);
        add_param(m, cap, u, FC_INIT_NORMAL, proj_std, C, C, "transformer.h.%d.attn.c_proj.weight", i);
        add_param(m, cap, u, FC_INIT_ZEROS, 0, C, 0, "transformer.h.%d.attn.c_proj.bias", i);
        add_param(m, cap, u, FC_INIT_ONES, 0, C, 0, "transformer.h.%d.ln_2.weight", i);
        add_param(m, cap, u, FC_INIT_ZEROS, 0, C, 0, "transformer.h.%d.ln_2.bias", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, C, 4 * C, "transformer.h.%d.mlp.c_fc.weight", i);
        add_param(m, cap, u, FC_INIT_ZEROS, 0, 4 * C, 0, "transformer.h.%d.mlp.c_fc.bias", i);
        add_param(m, cap, u, FC_INIT_NORMAL, proj_std, 4 * C, C, "transformer.h.%d.mlp.c_proj.weight", i);
        add_param(m, cap, u, FC_INIT_ZEROS, 0, C, 0, "transformer.h.%d.mlp.c_proj.bias", i);
        m->stages[1 + i] = (fc_stage){FC_STAGE_BLOCK, i, u};
    }
    add_param(m, cap, 0, FC_INIT_ONES, 0, C, 0, "transformer.ln_f.weight");
    add_param(m, cap, 0, FC_INIT_ZEROS, 0, C, 0, "transformer.ln_f.bias");
    m->stages[0] = (fc_stage){FC_STAGE_EMBED, 0, 0};
    m->stages[L + 1] = (fc_stage){FC_STAGE_HEAD, 0, 0};
}

static void build_llama(fc_model *m, int cap) {
    const fc_model_config *c = &m->cfg;
    int V = c->vocab_size, C = c->n_embd, L = c->n_layer, I = c->intermediate_size;
    int Q = c->n_head * c->head_dim, KV = c->n_kv_head * c->head_dim;
    // Unit 0 is the root (embed_tokens, norm, and lm_head when untied); unit
    // 1 + i is model.layers.i (a LlamaDecoderLayer, as auto_wrap wraps it).
    m->n_units = 1 + L;
    m->units = callocCheck((size_t)m->n_units, sizeof(fc_unit));
    snprintf(m->units[0].name, sizeof m->units[0].name, "%s", "");
    m->n_stages = L + 2;
    m->stages = callocCheck((size_t)m->n_stages, sizeof(fc_stage));
    // LlamaPreTrainedModel._init_weights: normal(0, initializer_range) for
    // every Linear and Embedding weight, RMSNorm weights 1; no biases.
    float std = c->initializer_range;
    add_param(m, cap, 0, FC_INIT_NORMAL, std, V, C, "model.embed_tokens.weight");
    for (int i = 0; i < L; i++) {
        int u = 1 + i;
        snprintf(m->units[u].name, sizeof m->units[u].name, "model.layers.%d", i);
        // LlamaDecoderLayer.__init__'s order: self_attn, mlp, then the two norms
        add_param(m, cap, u, FC_INIT_NORMAL, std, Q, C, "model.layers.%d.self_attn.q_proj.weight", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, KV, C, "model.layers.%d.self_attn.k_proj.weight", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, KV, C, "model.layers.%d.self_attn.v_proj.weight", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, C, Q, "model.layers.%d.self_attn.o_proj.weight", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, I, C, "model.layers.%d.mlp.gate_proj.weight", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, I, C, "model.layers.%d.mlp.up_proj.weight", i);
        add_param(m, cap, u, FC_INIT_NORMAL, std, C, I, "model.layers.%d.mlp.down_proj.weight", i);
        add_param(m, cap, u, FC_INIT_ONES, 0, C, 0, "model.layers.%d.input_layernorm.weight", i);
        add_param(m, cap, u, FC_INIT_ONES, 0, C, 0, "model.layers.%d.post_attention_layernorm.weight", i);
        m->stages[1 + i] = (fc_stage){FC_STAGE_BLOCK, i, u};
    }
    add_param(m, cap, 0, FC_INIT_ONES, 0, C, 0, "model.norm.weight");
    // tied: lm_head.weight is embed_tokens.weight, one parameter (named_parameters lists it once)
    if (!c->tie_word_embeddings) add_param(m, cap, 0, FC_INIT_NORMAL, std, V, C, "lm_head.weight");
    m->stages[0] = (fc_stage){FC_STAGE_EMBED, 0, 0};
    m->stages[L + 1] = (fc_stage){FC_STAGE_HEAD, 0, 0};
}

void fc_model_build(fc_model *m, const fc_model_config *cfg) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->rope_sign = 1;
    int cap = cfg->kind == FC_MODEL_MLP ? 2 * cfg->n_layers : 4 + 12 * cfg->n_layer;
    m->params = callocCheck((size_t)cap, sizeof(fc_param));
    // gpt2's root module holds wte, wpe and ln_f, llama's embed_tokens, norm
    // and lm_head; mlp's root holds nothing.
    m->root_unit = cfg->kind == FC_MODEL_MLP ? -1 : 0;
    if (cfg->kind == FC_MODEL_MLP)
        build_mlp(m, cap);
    else if (cfg->kind == FC_MODEL_GPT2)
        build_gpt2(m, cap);
    else
        build_llama(m, cap);
    // Group parameters by unit (stable: registration order inside a unit) and
    // lay the units out one after another in the full flat buffer.
    m->unit_params = mallocCheck((size_t)m->n_params * sizeof(int));
    int k = 0;
    size_t offset = 0;
    for (int u = 0; u < m->n_units; u++) {
        fc_unit *unit = &m->units[u];
        unit->first_param = k;
        unit->offset = offset;
        for (int i = 0; i < m->n_params; i++) {
            fc_param *p = &m->params[i];
            if (p->unit != u) continue;
            m->unit_params[k++] = i;
            p->unit_offset = unit->numel;
            p->offset = offset + unit->numel;
            unit->numel += p->numel;
        }
        unit->n_params = k - unit->first_param;
        offset += unit->numel;
    }
    m->numel = offset;
}

void fc_model_free(fc_model *m) {
    free(m->params);
    free(m->unit_params);
    free(m->units);
    free(m->stages);
    memset(m, 0, sizeof *m);
}

int fc_model_find(const fc_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

int fc_model_param_index(const fc_model *m, const char *fmt, ...) {
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int i = fc_model_find(m, name);
    if (i < 0) fc_die(FC_EXIT_INTERNAL, "%s:%d: no parameter named %s", __FILE__, __LINE__, name);
    return i;
}
