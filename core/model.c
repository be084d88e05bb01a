// core/model.c — builds the parameter registry, see model.h.
#include "model.h"

#include <math.h>
#include <regex.h>
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

// LoRA (PEFT's LoraLayer, docs/contract.md §2) on layer l's linear `module` [out, in]
// when the target regex re matches its path: lora_A [r, in], initialised as
// PEFT's kaiming_uniform_(a=sqrt(5)) (uniform in +-1/sqrt(in)), and lora_B
// [out, r], zeros, registered right after the base weight (named_parameters'
// order inside the wrapped module). lora[] maps the base weight to lora_A.
static void lora_adapt(fc_model *m, int cap, const regex_t *re, int u, int l, const char *module, int out, int in) {
    char path[96];
    snprintf(path, sizeof path, "model.layers.%d.%s", l, module);
    if (!re || regexec(re, path, 0, NULL, 0) != 0) return;
    int r = m->cfg.lora_r;
    m->lora[m->n_params - 1] = m->n_params;
    add_param(m, cap, u, FC_INIT_UNIFORM, (float)(1.0 / sqrt((double)in)), r, in, "%s.lora_A.default.weight", path);
    add_param(m, cap, u, FC_INIT_ZEROS, 0, out, r, "%s.lora_B.default.weight", path);
    m->params[m->n_params - 2].lora = m->params[m->n_params - 1].lora = 1;
}

static void build_llama(fc_model *m, int cap, const regex_t *re) {
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
        // [out, in] of FC_LLAMA_LINEAR's q, k, v, o_proj, gate, up, down_proj
        const int shape[FC_LLAMA_N_LINEAR][2] = {{Q, C}, {KV, C}, {KV, C}, {C, Q}, {I, C}, {I, C}, {C, I}};
        for (int k = 0; k < FC_LLAMA_N_LINEAR; k++) {
            add_param(m, cap, u, FC_INIT_NORMAL, std, shape[k][0], shape[k][1], "model.layers.%d.%s.weight", i,
                      FC_LLAMA_LINEAR[k]);
            lora_adapt(m, cap, re, u, i, FC_LLAMA_LINEAR[k], shape[k][0], shape[k][1]);
        }
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
    int cap = cfg->kind == FC_MODEL_MLP ? 2 * cfg->n_layers : 4 + 26 * cfg->n_layer;
    m->params = callocCheck((size_t)cap, sizeof(fc_param));
    m->lora = mallocCheck((size_t)cap * sizeof *m->lora);
    for (int i = 0; i < cap; i++) m->lora[i] = -1;
    m->lora_scale = cfg->lora_r ? cfg->lora_alpha / cfg->lora_r : 0;
    regex_t re;  // a validated config's target compiles
    int lora = cfg->lora_r > 0 && regcomp(&re, cfg->lora_target, REG_EXTENDED | REG_NOSUB) == 0;
    // gpt2's root module holds wte, wpe and ln_f, llama's embed_tokens, norm
    // and lm_head; mlp's root holds nothing.
    m->root_unit = cfg->kind == FC_MODEL_MLP ? -1 : 0;
    if (cfg->kind == FC_MODEL_MLP)
        build_mlp(m, cap);
    else if (cfg->kind == FC_MODEL_GPT2)
        build_gpt2(m, cap);
    else
        build_llama(m, cap, lora ? &re : NULL);
    if (lora) regfree(&re);
    // PEFT freezes every parameter but the adapters
    for (int i = 0; i < m->n_params && cfg->lora_r; i++) m->n_frozen += m->params[i].frozen = !m->params[i].lora;
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

void fc_model_build_run(fc_model *m, const fc_run_config *c) {
    fc_model_build(m, &c->model);
    fc_error e;
    if (c->freeze[0] && fc_model_freeze(m, c->freeze, &e))
        fc_die(FC_EXIT_INTERNAL, "%s:%d: a validated --freeze failed: %s", __FILE__, __LINE__, e.msg);
}

int fc_regex_compile(regex_t *re, const char *what, const char *rx, fc_error *e) {
    size_t product = 1;
    int after_quantifier = 0;
    for (size_t i = 0; rx[i];) {
        char c = rx[i];
        if (c == '\\' && rx[i + 1]) {  // an escaped character is an atom
            i += 2, after_quantifier = 0;
            continue;
        }
        if (c == '[') {  // a bracket expression is an atom: skip to its ']' (a leading ']' is a member)
            size_t j = i + 1 + (rx[i + 1] == '^');
            j += rx[j] == ']';
            while (rx[j] && rx[j] != ']') j++;
            i = rx[j] ? j + 1 : j, after_quantifier = 0;
            continue;
        }
        int interval = c == '{' && rx[i + 1] >= '0' && rx[i + 1] <= '9';
        if (c == '*' || c == '+' || c == '?' || interval) {
            if (after_quantifier)
                return fc_fail(e, "%s: a quantifier right after another (a repeated repetition) is refused, as the "
                                  "adapter's Python re refuses it", what);
            size_t end = i + 1;
            if (interval) {  // {m}, {m,} or {m,n}: the larger bound counts
                unsigned long m = strtoul(rx + i + 1, NULL, 10), n = m;
                const char *comma = strchr(rx + i, ','), *close = strchr(rx + i, '}');
                if (comma && close && comma < close && comma[1] != '}') n = strtoul(comma + 1, NULL, 10);
                if (n > FC_REGEX_REPEAT_MAX || (product *= n ? n : 1) > FC_REGEX_REPEAT_MAX)
                    return fc_fail(e, "%s: its repeat counts multiply past %d (no parameter name is that long)", what,
                                   FC_REGEX_REPEAT_MAX);
                end = close ? (size_t)(close - rx) + 1 : strlen(rx);
            }
            i = end, after_quantifier = 1;
            continue;
        }
        i++, after_quantifier = 0;
    }
    int rc = regcomp(re, rx, REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char why[128];
        regerror(rc, re, why, sizeof why);
        return fc_fail(e, "%s is not a POSIX extended regex: %s", what, why);
    }
    return 0;
}

int fc_model_freeze(fc_model *m, const char *regex, fc_error *e) {
    regex_t re;
    char what[300];
    snprintf(what, sizeof what, "--freeze '%s'", regex);
    if (fc_regex_compile(&re, what, regex, e)) return -1;
    int *hit = callocCheck((size_t)m->n_params, sizeof *hit), n = 0;
    for (int i = 0; i < m->n_params; i++) n += hit[i] = regexec(&re, m->params[i].name, 0, NULL, 0) == 0;
    regfree(&re);
    const char *why = n == 0 ? "matches no parameter of" : n == m->n_params ? "freezes every parameter of" : NULL;
    if (why) {
        free(hit);
        return fc_fail(e, "--freeze '%s' %s model %s (its names are Hugging Face's, e.g. '%s')", regex, why,
                       m->cfg.name, m->params[0].name);
    }
    for (int i = 0; i < m->n_params; i++) m->params[i].frozen = hit[i];
    m->n_frozen = n;
    free(hit);
    return 0;
}

// The parameter of unit u holding its element off: the last one starting at or before it.
static const fc_param *param_at(const fc_model *m, int u, size_t off) {
    const fc_unit *U = &m->units[u];
    int lo = 0, hi = U->n_params - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->params[m->unit_params[U->first_param + mid]].unit_offset <= off) lo = mid;
        else hi = mid - 1;
    }
    return &m->params[m->unit_params[U->first_param + lo]];
}

size_t fc_model_run_at(const fc_model *m, int u, size_t off, size_t n, int *frozen) {
    const fc_param *p = param_at(m, u, off);
    *frozen = p->frozen;
    size_t left = p->unit_offset + p->numel - off;
    return left < n ? left : n;
}

int fc_unit_trains(const fc_model *m, int u) {
    for (int k = 0; k < m->units[u].n_params; k++)
        if (!m->params[m->unit_params[m->units[u].first_param + k]].frozen) return 1;
    return 0;
}

size_t fc_model_trainable_in(const fc_model *m, int u, size_t off, size_t n) {
    if (!m->n_frozen) return n;
    size_t t = 0;
    for (size_t i = 0; i < n;) {
        int fz;
        size_t r = fc_model_run_at(m, u, off + i, n - i, &fz);
        if (!fz) t += r;
        i += r;
    }
    return t;
}

void fc_model_free(fc_model *m) {
    free(m->params);
    free(m->lora);
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
