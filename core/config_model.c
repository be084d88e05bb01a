// core/config_model.c — model presets, config.json parsing (cJSON), the
// LoRA spec, model validation and the config.json writer. See config.h.
#include "config.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "model.h"

#define CONFIG_JSON_MAX (16u << 20)  // a config.json is a few hundred bytes: anything near this is not one

// ---------------------------------------------------------------------------
// model presets

// The sizes gpt2 and llama share (config.h: llama's names map onto gpt2's fields).
static void lm_preset(fc_model_config *c, fc_model_kind kind, const char *name, int V, int P, int C, int L, int H,
                      float eps) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->vocab_size = V;
    c->n_positions = P;
    c->n_embd = C;
    c->n_layer = L;
    c->n_head = H;
    c->layer_norm_epsilon = eps;
}

static void gpt2_preset(fc_model_config *c, const char *name, int V, int P, int C, int L, int H) {
    lm_preset(c, FC_MODEL_GPT2, name, V, P, C, L, H, 1e-5f);
}

const char *fc_model_kind_name(fc_model_kind k) {
    return k == FC_MODEL_MLP ? "mlp" : k == FC_MODEL_GPT2 ? "gpt2" : "llama";
}

const char *fc_model_unit_class(fc_model_kind k) {
    return k == FC_MODEL_MLP ? "Linear" : k == FC_MODEL_GPT2 ? "GPT2Block" : "LlamaDecoderLayer";
}

void fc_model_config_describe(const fc_model_config *m, char *buf, size_t cap) {
    if (m->kind == FC_MODEL_MLP) {
        size_t k = (size_t)snprintf(buf, cap, "%.64s: mlp ", m->name);
        for (int i = 0; i <= m->n_layers && k < cap; i++)
            k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "-" : "", m->dims[i]);
    } else if (m->kind == FC_MODEL_LLAMA) {
        snprintf(buf, cap,
                 "%.64s: llama vocab %d, positions %d, hidden %d, layers %d, heads %d (kv %d) of %d, mlp %d, %s head, "
                 "eps %g, rope_theta %g",
                 m->name, m->vocab_size, m->n_positions, m->n_embd, m->n_layer, m->n_head, m->n_kv_head, m->head_dim,
                 m->intermediate_size, m->tie_word_embeddings ? "tied" : "untied", (double)m->layer_norm_epsilon,
                 m->rope_theta);
        size_t k = strlen(buf);
        if (m->lora_r && k < cap)
            snprintf(buf + k, cap - k, ", LoRA r %d alpha %g on '%.100s'", m->lora_r, m->lora_alpha, m->lora_target);
    } else {
        snprintf(buf, cap, "%.64s: gpt2 vocab %d, positions %d, n_embd %d, n_layer %d, n_head %d, eps %g", m->name,
                 m->vocab_size, m->n_positions, m->n_embd, m->n_layer, m->n_head, (double)m->layer_norm_epsilon);
    }
}

// d as it reads back from the JSON cJSON writes for it. cJSON prints 15
// significant digits wherever they read back within an ulp (its
// compare_double), so a value that needs 16 or 17 (rope_theta 9999999.999999999,
// found by fuzz.config) would come back from a trace's or checkpoint's
// config.json one ulp away. Taken as printed at parse, the config is what its
// JSON says, and the JSON is a fixed point.
static double as_printed(double d) {
    cJSON *n = cJSON_CreateNumber(d);
    char *s = n ? cJSON_PrintUnformatted(n) : NULL;
    if (!s) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    double back = strtod(s, NULL);
    cJSON_free(s);
    cJSON_Delete(n);
    return back;
}

// A Llama preset: LlamaConfig's rms_norm_eps, rope_theta and initializer_range.
static void llama_preset(fc_model_config *c, const char *name, int V, int P, int C, int L, int H,
                         int KV, int hd, int I, int tied) {
    lm_preset(c, FC_MODEL_LLAMA, name, V, P, C, L, H, 1e-6f);
    c->n_kv_head = KV;
    c->head_dim = hd;
    c->intermediate_size = I;
    c->tie_word_embeddings = tied;
    c->rope_theta = 10000.0;
    c->initializer_range = 0.02f;
}

#define PRESET_NAMES "mlp-micro, mlp-tiny, gpt2-micro, gpt2-tiny, gpt2-124m, llama-micro, llama-tiny"

int fc_model_config_load(const char *name, fc_model_config *out, fc_error *e) {
    if (strcmp(name, "mlp-tiny") == 0) {
        // 13 -> 17 -> 11 -> 7: unit sizes 238, 198, 84 elements, so the units
        // shard unevenly for W = 3, 5, 6, 7 (and 84 < 8*11: tiny shards).
        memset(out, 0, sizeof *out);
        out->kind = FC_MODEL_MLP;
        snprintf(out->name, sizeof out->name, "mlp-tiny");
        out->n_layers = 3;
        out->dims[0] = 13, out->dims[1] = 17, out->dims[2] = 11, out->dims[3] = 7;
        return 0;
    }
    if (strcmp(name, "mlp-micro") == 0) {
        // 3 -> 2 -> 2: units of 8 and 6 elements, smaller than W = 7 and 8,
        // so some ranks own only padding; the sweep shrinks mlps to this.
        memset(out, 0, sizeof *out);
        out->kind = FC_MODEL_MLP;
        snprintf(out->name, sizeof out->name, "mlp-micro");
        out->n_layers = 2;
        out->dims[0] = 3, out->dims[1] = 2, out->dims[2] = 2;
        return 0;
    }
    if (strcmp(name, "gpt2-micro") == 0) {
        // one block of C = 8: the smallest GPT-2 the sweep shrinks to
        gpt2_preset(out, "gpt2-micro", 13, 8, 8, 1, 2);
        return 0;
    }
    if (strcmp(name, "gpt2-tiny") == 0) {
        // C = 16 (a multiple of neither 3, 5 nor 7): blocks hold 3280 elements,
        // the root 2096, so every W in 3, 5, 6, 7 shards some unit unevenly.
        gpt2_preset(out, "gpt2-tiny", 97, 32, 16, 2, 4);
        return 0;
    }
    if (strcmp(name, "gpt2-124m") == 0) {
        gpt2_preset(out, "gpt2-124m", 50257, 1024, 768, 12, 12);
        return 0;
    }
    if (strcmp(name, "llama-micro") == 0) {
        // one layer, two query heads sharing one kv head (GQA), the head tied:
        // the smallest Llama the sweep shrinks to
        llama_preset(out, "llama-micro", 13, 8, 8, 1, 2, 1, 4, 12, 1);
        return 0;
    }
    if (strcmp(name, "llama-tiny") == 0) {
        // GQA 4:2 with head_dim 6 != hidden/heads (q_proj 16 -> 24), the head
        // untied: layers of 3104 = 2^5 * 97 elements, so W = 3, 5, 6, 7 shard
        // them unevenly, and FSDP2's rows (12, 16, 24, 40, 97) too.
        llama_preset(out, "llama-tiny", 97, 32, 16, 2, 4, 2, 6, 40, 0);
        return 0;
    }
    // Anything else must be a config.json file.
    char *buf;
    size_t len;
    int rc = fc_read_file_limited(name, CONFIG_JSON_MAX, &buf, &len, e);
    if (rc == FC_READ_CANNOT_OPEN)
        return fc_fail(e, "--model %s: not a preset (" PRESET_NAMES ") and cannot open it: %s", name,
                       strerror(errno));
    if (rc == FC_READ_TOO_LARGE) return fc_fail(e, "%s: config file larger than 16 MiB", name);
    if (rc) return -1;
    rc = fc_model_config_parse(buf, name, out, e);
    free(buf);
    return rc;
}

// Reads an integer field that must be present (or has a default when dflt >= 0).
static int json_int(const cJSON *j, const char *key, int dflt, int *out, const char *path,
                    fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) {
        if (dflt >= 0) {
            *out = dflt;
            return 0;
        }
        return fc_fail(e, "%s: missing \"%s\"", path, key);
    }
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < 1 || d > 1e9)
        return fc_fail(e, "%s: \"%s\" must be a positive integer", path, key);
    *out = (int)d;
    return 0;
}

// Reads a number in (0, hi], positive as a float too (1e-300 would silently
// become a zero epsilon), or dflt when absent (or null, when null_ok).
static int json_real(const cJSON *j, const char *key, double dflt, double hi, double *out,
                     const char *path, fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !((float)v->valuedouble > 0) || v->valuedouble > hi)
        return fc_fail(e, "%s: \"%s\" must be a number in (0, %g]", path, key, hi);
    *out = v->valuedouble;
    return 0;
}

// Refuses a key whose value is not the one fsdpcheck models (a feature it
// would otherwise silently ignore). want: a JSON literal ("false", "null",
// "\"silu\"", "0"); absent is accepted.
static int json_only(const cJSON *j, const char *key, const char *want, const char *path, fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) return 0;
    cJSON *w = cJSON_Parse(want);
    if (!w) fc_die(FC_EXIT_INTERNAL, "%s:%d: bad literal %s", __FILE__, __LINE__, want);
    int same = cJSON_Compare(v, w, 1) || (cJSON_IsNumber(v) && cJSON_IsNumber(w) && v->valuedouble == w->valuedouble);
    cJSON_Delete(w);
    return same ? 0 : fc_fail(e, "%s: only \"%s\": %s is supported", path, key, want);
}

// LlamaConfig's fields (transformers' configuration_llama.py; its defaults
// for the keys a file may omit). rope_theta may also come inside
// transformers 5's "rope_parameters" {"rope_type": "default", "rope_theta": ...}.
static int parse_llama(const cJSON *j, const char *path, fc_model_config *out, fc_error *e) {
    out->kind = FC_MODEL_LLAMA;
    if (json_int(j, "vocab_size", 32000, &out->vocab_size, path, e) ||
        json_int(j, "max_position_embeddings", 2048, &out->n_positions, path, e) ||
        json_int(j, "hidden_size", 4096, &out->n_embd, path, e) ||
        json_int(j, "intermediate_size", 11008, &out->intermediate_size, path, e) ||
        json_int(j, "num_hidden_layers", 32, &out->n_layer, path, e) ||
        json_int(j, "num_attention_heads", 32, &out->n_head, path, e))
        return -1;
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(j, "num_key_value_heads");
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (!kv || cJSON_IsNull(kv))
        out->n_kv_head = out->n_head;  // LlamaConfig's default: multi-head attention
    else if (json_int(j, "num_key_value_heads", -1, &out->n_kv_head, path, e))
        return -1;
    if (cJSON_IsNull(hd) || !hd)
        out->head_dim = out->n_embd / out->n_head;  // LlamaConfig's default (0 if n_head > hidden_size: refused below)
    else if (json_int(j, "head_dim", -1, &out->head_dim, path, e))
        return -1;
    double eps = 0, theta = 0, init = 0;
    if (json_real(j, "rms_norm_eps", 1e-6, 1, &eps, path, e) ||
        json_real(j, "rope_theta", 10000, 1e12, &theta, path, e) ||
        json_real(j, "initializer_range", 0.02, 1, &init, path, e))
        return -1;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp) || json_only(rp, "rope_type", "\"default\"", path, e))
            return fc_fail(e, "%s: only \"rope_parameters\" of \"rope_type\": \"default\" is supported", path);
        if (cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") &&
            json_real(rp, "rope_theta", 10000, 1e12, &theta, path, e))
            return -1;
    }
    out->layer_norm_epsilon = (float)eps;
    out->rope_theta = as_printed(theta);
    out->initializer_range = (float)init;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    if (tie && !cJSON_IsBool(tie)) return fc_fail(e, "%s: \"tie_word_embeddings\" must be true or false", path);
    out->tie_word_embeddings = cJSON_IsTrue(tie);  // LlamaConfig's default: untied
    // What fsdpcheck's Llama does not model must not be silently ignored.
    if (json_only(j, "hidden_act", "\"silu\"", path, e) || json_only(j, "attention_bias", "false", path, e) ||
        json_only(j, "mlp_bias", "false", path, e) || json_only(j, "rope_scaling", "null", path, e) ||
        json_only(j, "attention_dropout", "0", path, e) || json_only(j, "pretraining_tp", "1", path, e))
        return -1;
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *fc_json_duplicate_key(const cJSON *obj) {
    if (!cJSON_IsObject(obj) && !cJSON_IsArray(obj)) return NULL;
    int n = cJSON_GetArraySize(obj);
    const char *dup = NULL;
    if (cJSON_IsObject(obj) && n > 1) {
        const char **keys = mallocCheck((size_t)n * sizeof *keys);
        int k = 0;
        for (const cJSON *c = obj->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
        qsort(keys, (size_t)k, sizeof *keys, cmp_str_ptr);
        for (int i = 1; i < k && !dup; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
        free(keys);
    }
    for (const cJSON *c = obj->child; c && !dup; c = c->next) dup = fc_json_duplicate_key(c);
    return dup;
}

// GPT2Config's fields; its defaults (the 124M model) for the keys a file may omit.
static int parse_gpt2(const cJSON *j, const char *path, fc_model_config *out, fc_error *e) {
    out->kind = FC_MODEL_GPT2;
    if (json_int(j, "vocab_size", 50257, &out->vocab_size, path, e) ||
        json_int(j, "n_positions", 1024, &out->n_positions, path, e) ||
        json_int(j, "n_embd", 768, &out->n_embd, path, e) ||
        json_int(j, "n_layer", 12, &out->n_layer, path, e) ||
        json_int(j, "n_head", 12, &out->n_head, path, e))
        return -1;
    double eps = 0;
    if (json_real(j, "layer_norm_epsilon", 1e-5, 1, &eps, path, e)) return -1;
    out->layer_norm_epsilon = (float)eps;
    // Features fsdpcheck's GPT-2 does not model must not be silently ignored.
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_new") != 0))
        return fc_fail(e, "%s: only \"activation_function\": \"gelu_new\" is supported", path);
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(j, "n_inner");
    if (inner && !cJSON_IsNull(inner))
        return fc_fail(e, "%s: \"n_inner\" must be null (the MLP is 4 * n_embd)", path);
    return 0;
}

// fsdpcheck's own MLP: "dims", the width of each layer's input and the classes.
static int parse_mlp(const cJSON *j, const char *path, fc_model_config *out, fc_error *e) {
    out->kind = FC_MODEL_MLP;
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(j, "dims");
    int n = cJSON_IsArray(dims) ? cJSON_GetArraySize(dims) : 0;
    if (n < 2 || n > FC_MLP_MAX_LAYERS + 1)
        return fc_fail(e, "%s: \"dims\" must be an array of 2 to %d positive integers", path, FC_MLP_MAX_LAYERS + 1);
    out->n_layers = n - 1;
    for (int i = 0; i < n; i++) {
        const cJSON *d = cJSON_GetArrayItem(dims, i);
        if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) || d->valuedouble < 1 ||
            d->valuedouble > 1e6)
            return fc_fail(e, "%s: \"dims\"[%d] must be a positive integer", path, i);
        out->dims[i] = (int)d->valuedouble;
    }
    return 0;
}

// "fsdpcheck_lora", written by fc_model_config_to_json for a LoRA model; absent is none.
static int parse_lora(const cJSON *j, const char *path, fc_model_config *out, fc_error *e) {
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(j, "fsdpcheck_lora");
    if (!lora) return 0;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(lora, "r"), *al = cJSON_GetObjectItemCaseSensitive(lora, "lora_alpha"),
                *tg = cJSON_GetObjectItemCaseSensitive(lora, "target");
    if (!cJSON_IsObject(lora) || !cJSON_IsNumber(r) || r->valuedouble != floor(r->valuedouble) ||
        r->valuedouble < 1 || r->valuedouble > 4096 || !cJSON_IsNumber(al) || !cJSON_IsString(tg) ||
        strlen(tg->valuestring) >= sizeof out->lora_target)
        return fc_fail(e, "%s: \"fsdpcheck_lora\" must be {\"r\": 1..4096, \"lora_alpha\": number, \"target\": regex}", path);
    out->lora_r = (int)r->valuedouble;
    out->lora_alpha = al->valuedouble;
    snprintf(out->lora_target, sizeof out->lora_target, "%s", tg->valuestring);
    return 0;
}

// The fields of j's "model_type", then the LoRA; 0, or -1 with e set.
static int parse_model(const cJSON *j, const char *path, fc_model_config *out, fc_error *e) {
    if (!cJSON_IsObject(j)) return fc_fail(e, "%s: config must be a JSON object", path);
    const char *dup = fc_json_duplicate_key(j);
    if (dup) return fc_fail(e, "%s: key \"%.64s\" appears twice", path, dup);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (!cJSON_IsString(mt))
        return fc_fail(e, "%s: missing \"model_type\" (\"gpt2\", \"llama\" or \"fsdpcheck-mlp\")", path);
    snprintf(out->name, sizeof out->name, "%s", path);
    int rc;
    if (strcmp(mt->valuestring, "gpt2") == 0) rc = parse_gpt2(j, path, out, e);
    else if (strcmp(mt->valuestring, "llama") == 0) rc = parse_llama(j, path, out, e);
    else if (strcmp(mt->valuestring, "fsdpcheck-mlp") == 0) rc = parse_mlp(j, path, out, e);
    else
        return fc_fail(e, "%s: unsupported \"model_type\": \"%s\" (expected \"gpt2\", \"llama\" or \"fsdpcheck-mlp\")",
                       path, mt->valuestring);
    if (rc || parse_lora(j, path, out, e)) return -1;
    return fc_model_config_validate(out, e);
}

int fc_model_config_parse(const char *json, const char *path, fc_model_config *out, fc_error *e) {
    memset(out, 0, sizeof *out);
    cJSON *j = cJSON_ParseWithOpts(json, NULL, 1);  // 1: nothing but whitespace after the value
    if (!j) return fc_fail(e, "%s: not valid JSON", path);
    int rc = parse_model(j, path, out, e);
    cJSON_Delete(j);
    return rc;
}

int fc_model_config_equal(const fc_model_config *a, const fc_model_config *b) {
    if (a->kind != b->kind) return 0;
    if (a->kind == FC_MODEL_MLP) {
        if (a->n_layers != b->n_layers) return 0;
        for (int i = 0; i <= a->n_layers; i++)
            if (a->dims[i] != b->dims[i]) return 0;
        return 1;
    }
    return a->vocab_size == b->vocab_size && a->n_positions == b->n_positions && a->n_embd == b->n_embd &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->layer_norm_epsilon == b->layer_norm_epsilon &&
           a->n_kv_head == b->n_kv_head && a->head_dim == b->head_dim &&
           a->intermediate_size == b->intermediate_size && a->tie_word_embeddings == b->tie_word_embeddings &&
           a->rope_theta == b->rope_theta && a->initializer_range == b->initializer_range &&
           a->lora_r == b->lora_r && (!a->lora_r || (a->lora_alpha == b->lora_alpha &&
                                                      !strcmp(a->lora_target, b->lora_target)));
}

const char *const FC_LLAMA_LINEAR[FC_LLAMA_N_LINEAR] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj",     "mlp.up_proj",
                                                       "mlp.down_proj"};

// The LoRA target's checks: a llama, r >= 1, alpha > 0, a regex that compiles
// and matches a decoder-layer linear of layer 0 (every layer has the same).
static int validate_lora(const fc_model_config *c, fc_error *e) {
    if (c->kind != FC_MODEL_LLAMA)
        return fc_fail(e, "LoRA applies to llama's decoder-layer linears; model %s is %s", c->name,
                       fc_model_kind_name(c->kind));
    if (c->lora_r < 1 || c->lora_r > 4096) return fc_fail(e, "LoRA rank r %d is outside 1..4096", c->lora_r);
    if (!(c->lora_alpha > 0) || !isfinite(c->lora_alpha))
        return fc_fail(e, "LoRA alpha %g must be a finite number above 0", c->lora_alpha);
    regex_t re;
    char what[200];
    snprintf(what, sizeof what, "LoRA target '%s'", c->lora_target);
    if (fc_regex_compile(&re, what, c->lora_target, e)) return -1;
    int hits = 0;
    for (int i = 0; i < FC_LLAMA_N_LINEAR; i++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.0.%s", FC_LLAMA_LINEAR[i]);
        hits += regexec(&re, name, 0, NULL, 0) == 0;
    }
    regfree(&re);
    if (!hits)
        return fc_fail(e, "LoRA target '%s' matches no decoder-layer linear (q_proj, k_proj, v_proj, o_proj, "
                          "gate_proj, up_proj, down_proj under model.layers.N)", c->lora_target);
    return 0;
}

int fc_model_config_set_lora(fc_model_config *c, const char *spec, fc_error *e) {
    char *end;
    errno = 0;
    long r = strtol(spec, &end, 10);
    if (errno || end == spec || *end != ':') return fc_fail(e, "--lora %s: expected R:ALPHA:REGEX (4:8:q_proj)", spec);
    const char *a = end + 1;
    double alpha = strtod(a, &end);
    if (end == a || *end != ':' || !end[1]) return fc_fail(e, "--lora %s: expected R:ALPHA:REGEX (4:8:q_proj)", spec);
    if (strlen(end + 1) >= sizeof c->lora_target)
        return fc_fail(e, "--lora: the target regex is longer than %zu characters", sizeof c->lora_target - 1);
    if (r < 1 || r > 4096) return fc_fail(e, "--lora %s: rank R %ld is outside 1..4096", spec, r);
    fc_model_config t = *c;
    t.lora_r = (int)r;
    t.lora_alpha = alpha;
    snprintf(t.lora_target, sizeof t.lora_target, "%s", end + 1);
    if (validate_lora(&t, e)) return -1;
    *c = t;
    return 0;
}

static int validate_llama(const fc_model_config *c, fc_error *e) {
    if (c->vocab_size < 2 || c->n_positions < 1 || c->n_embd < 1 || c->n_layer < 1 || c->n_head < 1 ||
        c->n_kv_head < 1 || c->head_dim < 1 || c->intermediate_size < 1)
        return fc_fail(e, "model %s: llama sizes must be positive (vocab_size >= 2, head_dim >= 1)", c->name);
    if (c->n_head % c->n_kv_head != 0)
        return fc_fail(e, "model %s: num_attention_heads %d is not divisible by num_key_value_heads %d", c->name,
                       c->n_head, c->n_kv_head);
    if (c->head_dim % 2 != 0)
        return fc_fail(e, "model %s: head_dim %d is odd (rotary embeddings rotate its two halves)", c->name,
                       c->head_dim);
    if (!(c->layer_norm_epsilon > 0) || !(c->rope_theta > 0) || !(c->initializer_range > 0))
        return fc_fail(e, "model %s: rms_norm_eps, rope_theta and initializer_range must be positive", c->name);
    // Sizes are used as int element counts in the math; keep products in range.
    double q = (double)c->n_head * c->head_dim;
    if ((double)c->vocab_size * c->n_embd > 2e9 || q * c->n_embd > 2e9 ||
        (double)c->intermediate_size * c->n_embd > 2e9 || c->n_layer > 1000)
        return fc_fail(e, "model %s: too large for fsdpcheck (a tensor exceeds 2^31 elements)", c->name);
    return 0;
}

int fc_model_config_validate(const fc_model_config *c, fc_error *e) {
    if (c->kind == FC_MODEL_MLP) {
        if (c->n_layers < 1 || c->n_layers > FC_MLP_MAX_LAYERS)
            return fc_fail(e, "model %s: mlp needs 1 to %d layers", c->name, FC_MLP_MAX_LAYERS);
        for (int i = 0; i <= c->n_layers; i++)
            if (c->dims[i] < 1) return fc_fail(e, "model %s: mlp dims must be positive", c->name);
        if (c->dims[c->n_layers] < 2)
            return fc_fail(e, "model %s: mlp needs at least 2 classes", c->name);
        return 0;
    }
    if (c->lora_r && validate_lora(c, e)) return -1;
    if (c->kind == FC_MODEL_LLAMA) return validate_llama(c, e);
    if (c->vocab_size < 2 || c->n_positions < 1 || c->n_embd < 1 || c->n_layer < 1 ||
        c->n_head < 1)
        return fc_fail(e, "model %s: gpt2 sizes must be positive (vocab_size >= 2)", c->name);
    if (c->n_embd % c->n_head != 0)
        return fc_fail(e, "model %s: n_embd %d is not divisible by n_head %d", c->name, c->n_embd,
                       c->n_head);
    // Sizes are used as int element counts in the math; keep products in range.
    if ((double)c->vocab_size * c->n_embd > 2e9 || (double)c->n_positions * c->n_embd > 2e9 ||
        (double)c->n_embd * c->n_embd * 4 > 2e9 || c->n_layer > 1000)
        return fc_fail(e, "model %s: too large for fsdpcheck (a tensor exceeds 2^31 elements)",
                       c->name);
    return 0;
}

// The shortest decimal that reads back as the same float, as a double, so a
// config.json says 1e-05 rather than 9.99999974737875e-06.
static double shortest_double(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f) return d;
    }
    return (double)f;
}

cJSON *fc_model_config_to_json(const fc_model_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    if (c->kind == FC_MODEL_MLP) {
        cJSON_AddStringToObject(j, "model_type", "fsdpcheck-mlp");
        cJSON_AddItemToObject(j, "dims", cJSON_CreateIntArray(c->dims, c->n_layers + 1));
    } else if (c->kind == FC_MODEL_LLAMA) {
        // Enough for transformers.LlamaForCausalLM.from_pretrained.
        cJSON_AddStringToObject(j, "model_type", "llama");
        cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
        cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
        cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
        cJSON_AddNumberToObject(j, "max_position_embeddings", c->n_positions);
        cJSON_AddNumberToObject(j, "hidden_size", c->n_embd);
        cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
        cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layer);
        cJSON_AddNumberToObject(j, "num_attention_heads", c->n_head);
        cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_head);
        cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
        cJSON_AddNumberToObject(j, "rms_norm_eps", shortest_double(c->layer_norm_epsilon));
        cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
        cJSON_AddNumberToObject(j, "initializer_range", shortest_double(c->initializer_range));
        cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
        cJSON_AddStringToObject(j, "hidden_act", "silu");
        cJSON_AddBoolToObject(j, "attention_bias", 0);
        cJSON_AddBoolToObject(j, "mlp_bias", 0);
        cJSON_AddNumberToObject(j, "attention_dropout", 0);
        cJSON_AddNullToObject(j, "rope_scaling");
    } else {
        // Enough for transformers.GPT2LMHeadModel.from_pretrained.
        cJSON_AddStringToObject(j, "model_type", "gpt2");
        cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
        cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
        cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
        cJSON_AddNumberToObject(j, "n_positions", c->n_positions);
        cJSON_AddNumberToObject(j, "n_ctx", c->n_positions);
        cJSON_AddNumberToObject(j, "n_embd", c->n_embd);
        cJSON_AddNumberToObject(j, "n_layer", c->n_layer);
        cJSON_AddNumberToObject(j, "n_head", c->n_head);
        cJSON_AddNumberToObject(j, "layer_norm_epsilon", shortest_double(c->layer_norm_epsilon));
        cJSON_AddStringToObject(j, "activation_function", "gelu_new");
        cJSON_AddNullToObject(j, "n_inner");
        cJSON_AddNumberToObject(j, "resid_pdrop", 0);
        cJSON_AddNumberToObject(j, "embd_pdrop", 0);
        cJSON_AddNumberToObject(j, "attn_pdrop", 0);
        cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    }
    cJSON_AddStringToObject(j, "fsdpcheck_name", c->name);
    if (c->lora_r) {  // PEFT's LoraConfig fields; its target is fsdpcheck's regex
        cJSON *l = cJSON_AddObjectToObject(j, "fsdpcheck_lora");
        cJSON_AddNumberToObject(l, "r", c->lora_r);
        cJSON_AddNumberToObject(l, "lora_alpha", c->lora_alpha);
        cJSON_AddStringToObject(l, "target", c->lora_target);
    }
    return j;
}
