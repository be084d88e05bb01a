// core/config.c — presets, config.json parsing (cJSON), run-config defaults,
// validation and JSON round trip. See config.h.
#include "config.h"
#include "layout.h"
#include "model.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

#define CONFIG_JSON_MAX (16u << 20)  // a config.json is a few hundred bytes: anything near this is not one

// ---------------------------------------------------------------------------
// enum names

static const char *STRATEGY_NAMES[FC_STRATEGY_COUNT] = {
    "local", "no_shard", "full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"};
static const char *PREFETCH_NAMES[] = {"none", "pre", "post"};
static const char *OPT_NAMES[] = {"adamw", "sgd"};
static const char *DIVIDE_NAMES[] = {"prepost", "avg", "sum-then-divide"};
static const char *NORM_NAMES[] = {"1", "2", "inf"};
static const char *COMM_NAMES[] = {"auto", "nccl", "mpi"};
static const char *ACT_CKPT_NAMES[] = {"none", "inside", "outside"};
static const char *FAULT_NAMES[FC_FAULT_COUNT] = {
    "none", "no_divide", "divide_twice", "shard_offset", "padding_leak", "stale_gather",
    "skip_root_reduce", "hsdp_no_replicate", "no_sync_overwrite", "clip_local_norm",
    "clip_double_count", "ckpt_drop_optim", "ckpt_swap", "tied_untied", "bf16_truncate",
    "reduce_dtype_ignored", "adam_step_reset", "data_overlap", "avg_tail", "clip_eps_per_rank",
    "clip_hsdp_shard_norm", "recompute_dtype", "fsdp2_avg_twice", "fsdp2_even_rows", "fsdp2_padding_norm",
    "fsdp2_post_forward_group", "dcp_saved_offsets", "rope_half", "frozen_decay",
    "frozen_in_norm", "frozen_stepped", "lora_alpha"};

// The property of DESIGN §8 expected to catch each fault (the fault catalogue,
// reference/faults/faults.c, has each bug beside the same number): the sweep
// shrinks an injected fault's case while this property still fails, and the
// gate's fault tests require it.
static const int FAULT_PROPERTY[FC_FAULT_COUNT] = {
    [FC_FAULT_NONE] = 0,
    [FC_FAULT_NO_DIVIDE] = 1,             // gradients W times the local model's
    [FC_FAULT_DIVIDE_TWICE] = 1,
    [FC_FAULT_SHARD_OFFSET] = 2,          // a sharded layout that no_shard does not have
    [FC_FAULT_PADDING_LEAK] = 5,          // padding exists only where shards are uneven
    [FC_FAULT_STALE_GATHER] = 4,          // only prefetched gathers go stale
    [FC_FAULT_SKIP_ROOT_REDUCE] = 1,
    [FC_FAULT_HSDP_NO_REPLICATE] = 3,     // hybrid against full_shard over the same world
    [FC_FAULT_NO_SYNC_OVERWRITE] = 6,     // accumulation against the joined batch
    [FC_FAULT_CLIP_LOCAL_NORM] = 8,
    [FC_FAULT_CLIP_DOUBLE_COUNT] = 8,
    [FC_FAULT_CKPT_DROP_OPTIM] = 7,       // the checkpoint round trip
    [FC_FAULT_CKPT_SWAP] = 7,
    [FC_FAULT_TIED_UNTIED] = 1,
    [FC_FAULT_BF16_TRUNCATE] = 9,         // mixed precision against DDP under the same policy
    [FC_FAULT_REDUCE_DTYPE_IGNORED] = 9,
    [FC_FAULT_ADAM_STEP_RESET] = 7,
    [FC_FAULT_DATA_OVERLAP] = 1,
    [FC_FAULT_AVG_TAIL] = 1,
    [FC_FAULT_CLIP_EPS_PER_RANK] = 8,     // only the norm (and the clip coefficient) moves
    [FC_FAULT_CLIP_HSDP_SHARD_NORM] = 8,
    [FC_FAULT_RECOMPUTE_DTYPE] = 15,      // only the recompute moves: checkpointing against none
    [FC_FAULT_FSDP2_AVG_TWICE] = 1,       // gradients 1/W of the local model's
    [FC_FAULT_FSDP2_EVEN_ROWS] = 10,      // the same math on another split: only the rows each rank steps show it
    [FC_FAULT_FSDP2_PADDING_NORM] = 8,    // only the norm (and the clip coefficient) moves
    [FC_FAULT_FSDP2_POST_FORWARD_GROUP] = 1,  // backward computes with other rows' parameters
    [FC_FAULT_DCP_SAVED_OFFSETS] = 7,     // only a DCP checkpoint's round trip reads the offsets
    [FC_FAULT_ROPE_HALF] = 1,             // the model's math: every loss against the local model's
    [FC_FAULT_FROZEN_DECAY] = 1,          // a frozen parameter moves: the parameters against the local model's
    [FC_FAULT_FROZEN_IN_NORM] = 8,        // only the norm (and the clip coefficient) moves
    [FC_FAULT_FROZEN_STEPPED] = 1,        // a frozen parameter gets a gradient and moves
    [FC_FAULT_LORA_ALPHA] = 1,            // the model's math: LoRA's gradients r times the local model's
};

int fc_fault_property(fc_fault f) { return (unsigned)f < FC_FAULT_COUNT ? FAULT_PROPERTY[f] : 0; }

// Which FSDP versions each fault's seam acts in (reference/faults/faults.c):
// FSDP1's flat chunks unless listed (their seams read the FlatParameter's
// padding and offsets), both where the bug is in no layout, FSDP2's own.
#define V1 (1u << 1)
#define V2 (1u << 2)
static const unsigned FAULT_VERSIONS[FC_FAULT_COUNT] = {
    // bugs of the divide, the data and the checkpoint loader: no layout in them
    [FC_FAULT_NO_DIVIDE] = V1 | V2,
    [FC_FAULT_DIVIDE_TWICE] = V1 | V2,
    [FC_FAULT_DATA_OVERLAP] = V1 | V2,
    [FC_FAULT_CKPT_DROP_OPTIM] = V1 | V2,
    [FC_FAULT_CKPT_SWAP] = V1 | V2,
    [FC_FAULT_ADAM_STEP_RESET] = V1 | V2,
    [FC_FAULT_RECOMPUTE_DTYPE] = V1 | V2,
    [FC_FAULT_FSDP2_AVG_TWICE] = V2,
    [FC_FAULT_FSDP2_EVEN_ROWS] = V2,
    [FC_FAULT_FSDP2_PADDING_NORM] = V2,
    [FC_FAULT_FSDP2_POST_FORWARD_GROUP] = V2,
    [FC_FAULT_DCP_SAVED_OFFSETS] = V2,
    [FC_FAULT_ROPE_HALF] = V1 | V2,
    [FC_FAULT_FROZEN_DECAY] = V1 | V2,
    [FC_FAULT_FROZEN_IN_NORM] = V1 | V2,
    [FC_FAULT_FROZEN_STEPPED] = V1 | V2,
    [FC_FAULT_LORA_ALPHA] = V1 | V2,
};

unsigned fc_fault_versions(fc_fault f) {
    if ((unsigned)f >= FC_FAULT_COUNT || f == FC_FAULT_NONE) return 0;
    return FAULT_VERSIONS[f] ? FAULT_VERSIONS[f] : V1;
}
#undef V1
#undef V2

static int parse_name(const char *s, const char **names, int n) {
    if (!s) return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

#define NAME_FUNCS(fn, type, table)                                            \
    const char *fc_##fn##_name(type v) { return table[v]; }                    \
    int fc_##fn##_parse(const char *s, type *out) {                            \
        int i = parse_name(s, table, (int)(sizeof table / sizeof table[0]));   \
        if (i < 0) return -1;                                                  \
        *out = (type)i;                                                        \
        return 0;                                                              \
    }
NAME_FUNCS(strategy, fc_strategy, STRATEGY_NAMES)
NAME_FUNCS(prefetch, fc_prefetch, PREFETCH_NAMES)
NAME_FUNCS(opt, fc_opt_kind, OPT_NAMES)
NAME_FUNCS(divide, fc_divide, DIVIDE_NAMES)
NAME_FUNCS(comm, fc_comm, COMM_NAMES)
NAME_FUNCS(norm, fc_norm_type, NORM_NAMES)
NAME_FUNCS(fault, fc_fault, FAULT_NAMES)
NAME_FUNCS(act_ckpt, fc_act_ckpt, ACT_CKPT_NAMES)

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

int fc_model_config_parse(const char *json, const char *path, fc_model_config *out, fc_error *e) {
    memset(out, 0, sizeof *out);
    cJSON *j = cJSON_ParseWithOpts(json, NULL, 1);  // 1: nothing but whitespace after the value
    if (!j) return fc_fail(e, "%s: not valid JSON", path);
    int rc = -1;
    if (!cJSON_IsObject(j)) {
        fc_fail(e, "%s: config must be a JSON object", path);
        goto done;
    }
    const char *dup = fc_json_duplicate_key(j);
    if (dup) {
        fc_fail(e, "%s: key \"%.64s\" appears twice", path, dup);
        goto done;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (!cJSON_IsString(mt)) {
        fc_fail(e, "%s: missing \"model_type\" (\"gpt2\", \"llama\" or \"fsdpcheck-mlp\")", path);
        goto done;
    }
    snprintf(out->name, sizeof out->name, "%s", path);
    if (strcmp(mt->valuestring, "gpt2") == 0) {
        out->kind = FC_MODEL_GPT2;
        // Defaults are GPT2Config's (the 124M model) for keys a file may omit.
        if (json_int(j, "vocab_size", 50257, &out->vocab_size, path, e) ||
            json_int(j, "n_positions", 1024, &out->n_positions, path, e) ||
            json_int(j, "n_embd", 768, &out->n_embd, path, e) ||
            json_int(j, "n_layer", 12, &out->n_layer, path, e) ||
            json_int(j, "n_head", 12, &out->n_head, path, e))
            goto done;
        double eps = 0;
        if (json_real(j, "layer_norm_epsilon", 1e-5, 1, &eps, path, e)) goto done;
        out->layer_norm_epsilon = (float)eps;
        // Features fsdpcheck's GPT-2 does not model must not be silently ignored.
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
        if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_new") != 0)) {
            fc_fail(e, "%s: only \"activation_function\": \"gelu_new\" is supported", path);
            goto done;
        }
        const cJSON *inner = cJSON_GetObjectItemCaseSensitive(j, "n_inner");
        if (inner && !cJSON_IsNull(inner)) {
            fc_fail(e, "%s: \"n_inner\" must be null (the MLP is 4 * n_embd)", path);
            goto done;
        }
    } else if (strcmp(mt->valuestring, "llama") == 0) {
        if (parse_llama(j, path, out, e)) goto done;
    } else if (strcmp(mt->valuestring, "fsdpcheck-mlp") == 0) {
        out->kind = FC_MODEL_MLP;
        const cJSON *dims = cJSON_GetObjectItemCaseSensitive(j, "dims");
        int n = cJSON_IsArray(dims) ? cJSON_GetArraySize(dims) : 0;
        if (n < 2 || n > FC_MLP_MAX_LAYERS + 1) {
            fc_fail(e, "%s: \"dims\" must be an array of 2 to %d positive integers", path,
                    FC_MLP_MAX_LAYERS + 1);
            goto done;
        }
        out->n_layers = n - 1;
        for (int i = 0; i < n; i++) {
            const cJSON *d = cJSON_GetArrayItem(dims, i);
            if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) ||
                d->valuedouble < 1 || d->valuedouble > 1e6) {
                fc_fail(e, "%s: \"dims\"[%d] must be a positive integer", path, i);
                goto done;
            }
            out->dims[i] = (int)d->valuedouble;
        }
    } else {
        fc_fail(e, "%s: unsupported \"model_type\": \"%s\" (expected \"gpt2\", \"llama\" or \"fsdpcheck-mlp\")",
                path, mt->valuestring);
        goto done;
    }
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(j, "fsdpcheck_lora");
    if (lora) {  // written by fc_model_config_to_json for a LoRA model
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(lora, "r"), *al = cJSON_GetObjectItemCaseSensitive(lora, "lora_alpha"),
                    *tg = cJSON_GetObjectItemCaseSensitive(lora, "target");
        if (!cJSON_IsObject(lora) || !cJSON_IsNumber(r) || r->valuedouble != floor(r->valuedouble) ||
            r->valuedouble < 1 || r->valuedouble > 4096 || !cJSON_IsNumber(al) || !cJSON_IsString(tg) ||
            strlen(tg->valuestring) >= sizeof out->lora_target) {
            fc_fail(e, "%s: \"fsdpcheck_lora\" must be {\"r\": 1..4096, \"lora_alpha\": number, \"target\": regex}", path);
            goto done;
        }
        out->lora_r = (int)r->valuedouble;
        out->lora_alpha = al->valuedouble;
        snprintf(out->lora_target, sizeof out->lora_target, "%s", tg->valuestring);
    }
    rc = fc_model_config_validate(out, e);
done:
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

// ---------------------------------------------------------------------------
// run config

void fc_run_config_defaults(fc_run_config *c) {
    memset(c, 0, sizeof *c);
    fc_error e;
    if (fc_model_config_load("mlp-tiny", &c->model, &e) != 0) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
    snprintf(c->impl, sizeof c->impl, "reference");
    c->strategy = FC_STRATEGY_LOCAL;
    c->fsdp_version = 1;
    c->backward_prefetch = FC_PREFETCH_NONE;
    c->param_dtype = c->reduce_dtype = FC_PREC_FP32;
    c->divide = FC_DIVIDE_PREPOST;
    c->grad_accum = 1;
    c->norm_type = FC_NORM_2;
    // torch.optim.AdamW defaults, except lr (1e-3 there too) and weight decay 0.01.
    c->optim.kind = FC_OPT_ADAMW;
    c->optim.lr = 1e-3;
    c->optim.weight_decay = 0.01;
    c->optim.beta1 = 0.9;
    c->optim.beta2 = 0.999;
    c->optim.eps = 1e-8;
    c->optim.momentum = 0.9;
    c->steps = 3;
    c->global_batch = 8;
    c->seq_len = 16;
    c->seed = 1234;
}

fc_divide fc_default_divide(const fc_run_config *c) {
    return c->fsdp_version == 2 && c->reduce_dtype != FC_PREC_FP16 ? FC_DIVIDE_AVG : FC_DIVIDE_PREPOST;
}

int fc_run_config_validate(const fc_run_config *c, fc_error *e) {
    if (fc_model_config_validate(&c->model, e)) return -1;
    if (c->steps < 1) return fc_fail(e, "--steps must be at least 1");
    if (c->global_batch < 1) return fc_fail(e, "--global-batch must be at least 1");
    if (c->grad_accum < 1) return fc_fail(e, "--grad-accum must be at least 1");
    if (c->no_sync && c->grad_accum < 2)
        return fc_fail(e, "--no-sync needs --grad-accum K with K >= 2");
    if (c->model.kind == FC_MODEL_GPT2 && (c->seq_len < 1 || c->seq_len > c->model.n_positions))
        return fc_fail(e, "--seq-len %d is outside 1..n_positions (%d)", c->seq_len,
                       c->model.n_positions);
    const fc_optim_config *o = &c->optim;
    if (!(o->lr >= 0) || !isfinite(o->lr)) return fc_fail(e, "--lr must be a finite number >= 0");
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return fc_fail(e, "--weight-decay must be a finite number >= 0");
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return fc_fail(e, "AdamW betas must be in [0, 1)");
    if (!(o->eps >= 0) || !isfinite(o->eps)) return fc_fail(e, "AdamW eps must be >= 0");
    if (!(o->momentum >= 0) || !isfinite(o->momentum)) return fc_fail(e, "--momentum must be >= 0");
    if (!(o->dampening >= 0 && o->dampening <= 1)) return fc_fail(e, "SGD dampening must be in [0, 1]");
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return fc_fail(e, "Nesterov momentum requires a momentum and zero dampening");
    if (!(c->clip_grad_norm >= 0) || !isfinite(c->clip_grad_norm))
        return fc_fail(e, "--clip-grad-norm must be >= 0");
    if (c->shard_group < 0) return fc_fail(e, "--shard-group must be positive");
    if (c->comm != FC_COMM_AUTO && !strcmp(c->impl, "reference"))
        return fc_fail(e, "--comm %s chooses a port's collective backend (--impl cuda); the reference "
                          "communicates through MPI only", fc_comm_name(c->comm));
    // Options that would change nothing under the chosen strategy are refused.
    int sharded = fc_strategy_sharded(c->strategy);
    int hybrid = fc_strategy_hybrid(c->strategy);
    const char *sname = fc_strategy_name(c->strategy);
    if (!sharded && c->backward_prefetch != FC_PREFETCH_NONE)
        return fc_fail(e, "--backward-prefetch needs a sharded strategy (%s gathers nothing)", sname);
    if (!sharded && c->forward_prefetch)
        return fc_fail(e, "--forward-prefetch needs a sharded strategy (%s gathers nothing)", sname);
    if (!sharded && c->limit_all_gathers)
        return fc_fail(e, "--limit-all-gathers needs a sharded strategy (%s gathers nothing)", sname);
    if (c->limit_all_gathers && !c->forward_prefetch && c->backward_prefetch == FC_PREFETCH_NONE)
        return fc_fail(e, "--limit-all-gathers limits prefetched all-gathers: add --forward-prefetch "
                          "or --backward-prefetch pre|post");
    if (c->forward_prefetch < 0 || c->backward_prefetch_depth < 0)
        return fc_fail(e, "a prefetch list's length must be at least 1");
    if (c->forward_prefetch > 1 && c->fsdp_version != 2)
        return fc_fail(e, "--forward-prefetch-units %d: FSDP1's forward_prefetch prefetches one unit; lists of more "
                          "are FSDP2's set_modules_to_forward_prefetch (give --fsdp-version 2)", c->forward_prefetch);
    if (c->backward_prefetch_depth && c->fsdp_version != 2)
        return fc_fail(e, "--backward-prefetch-units is FSDP2's set_modules_to_backward_prefetch: give --fsdp-version 2 "
                          "(FSDP1 has --backward-prefetch pre|post|none)");
    if (c->gradient_divide_factor != 0 && !(c->gradient_divide_factor > 0 && isfinite(c->gradient_divide_factor)))
        return fc_fail(e, "--gradient-divide-factor must be a finite number above 0");
    // FSDP1 has no set_gradient_divide_factor; the factor stays for the DDP
    // (no_shard) and local runs an FSDP2 run is judged against
    if (c->gradient_divide_factor > 0 && c->fsdp_version == 1 && fc_strategy_sharded(c->strategy))
        return fc_fail(e, "--gradient-divide-factor is FSDP2's set_gradient_divide_factor: give --fsdp-version 2 "
                          "(FSDP1 takes its factors from the world size)");
    if (c->fsdp_version != 1 && c->fsdp_version != 2)
        return fc_fail(e, "--fsdp-version %d is not 1 (FSDP1) or 2 (FSDP2, fully_shard)", c->fsdp_version);
    if (c->fsdp_version == 2) {
        // FSDP2 has no NO_SHARD (DDP is the replicated baseline) and none of
        // FSDP1's backward prefetch options or limiter: it prefetches one unit
        // ahead in backward by itself and has no rate limiter. In forward it
        // prefetches only by explicit lists: --forward-prefetch is each unit's
        // set_modules_to_forward_prefetch([the next unit])
        if (!sharded)
            return fc_fail(e, "--fsdp-version 2 needs a sharded strategy (FSDP2 has no %s; compare it with "
                              "--fsdp-version 1 --strategy no_shard, DDP)", sname);
        const char *fsdp1_only = c->backward_prefetch != FC_PREFETCH_NONE ? "--backward-prefetch"
                               : c->limit_all_gathers                  ? "--limit-all-gathers"
                                                                       : NULL;
        if (fsdp1_only)
            return fc_fail(e, "%s is an FSDP1 option, refused with --fsdp-version 2 (FSDP2 prefetches the next "
                              "unit in backward by itself and has no all-gather limiter)", fsdp1_only);
    }
    if (c->inject != FC_FAULT_NONE && !(fc_fault_versions(c->inject) & (1u << c->fsdp_version)))
        return fc_fail(e, "--inject %s is a fault of FSDP%d's layout, not of this --fsdp-version %d run%s",
                       fc_fault_name(c->inject), c->fsdp_version == 1 ? 2 : 1, c->fsdp_version,
                       c->fsdp_version == 1 ? " (FSDP2 needs a sharded strategy)" : "");
    if (c->inject == FC_FAULT_ROPE_HALF && c->model.kind != FC_MODEL_LLAMA)
        return fc_fail(e, "--inject rope_half needs a llama model (rotary embeddings); model %s has none",
                       c->model.name);
    if (c->inject == FC_FAULT_TIED_UNTIED && !fc_model_tied(&c->model))
        return fc_fail(e, "--inject tied_untied needs a tied LM head (gpt2, or llama with tie_word_embeddings); "
                          "model %s has none", c->model.name);
    if (c->freeze[0] && c->model.lora_r)
        return fc_fail(e, "--freeze with --lora: LoRA freezes every base parameter itself (PEFT's default)");
    if (c->freeze[0]) {
        fc_model m;
        fc_model_build(&m, &c->model);
        int rc = fc_model_freeze(&m, c->freeze, e);
        fc_model_free(&m);
        if (rc) return -1;
    }
    if (c->inject == FC_FAULT_LORA_ALPHA && !c->model.lora_r)
        return fc_fail(e, "--inject lora_alpha needs LoRA adapters: give --lora R:ALPHA:REGEX with R > 1");
    if (c->inject == FC_FAULT_LORA_ALPHA && c->model.lora_r == 1)
        return fc_fail(e, "--inject lora_alpha needs --lora with R > 1 (at r = 1, alpha and alpha / r agree)");
    int frozen_fault = c->inject == FC_FAULT_FROZEN_DECAY || c->inject == FC_FAULT_FROZEN_IN_NORM ||
                       c->inject == FC_FAULT_FROZEN_STEPPED;
    if (frozen_fault && !c->freeze[0] && !c->model.lora_r)
        return fc_fail(e, "--inject %s needs frozen parameters: give --freeze REGEX or --lora", fc_fault_name(c->inject));
    if (c->inject == FC_FAULT_FROZEN_DECAY && !(c->optim.weight_decay > 0))
        return fc_fail(e, "--inject frozen_decay needs a --weight-decay above 0 (there is no decay to misapply)");
    if (c->reshard_after_forward) {
        if (c->fsdp_version != 2)
            return fc_fail(e, "--reshard-after-forward %d is FSDP2's integer reshard_after_forward: give "
                              "--fsdp-version 2", c->reshard_after_forward);
        if (!fc_strategy_reshards(c->strategy))
            return fc_fail(e, "--reshard-after-forward %d needs a strategy that reshards after forward (full_shard, "
                              "hybrid_shard), not %s", c->reshard_after_forward, sname);
        if (c->reshard_after_forward < 2)
            return fc_fail(e, "--reshard-after-forward %d: R must be at least 2 (1 is reshard_after_forward=False: "
                              "--strategy shard_grad_op)", c->reshard_after_forward);
        if (c->cpu_offload)
            return fc_fail(e, "--reshard-after-forward with --cpu-offload is not modelled yet (the post-forward "
                              "slice stays on the device; give one)");
    }
    if (c->shard_group && !hybrid)
        return fc_fail(e, "--shard-group applies to hybrid_shard and hybrid_shard_zero2 only");
    if (c->strategy == FC_STRATEGY_LOCAL) {
        if (c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32)
            return fc_fail(e, "mixed precision needs a data-parallel strategy (compare FSDP with no_shard, P9)");
        if (c->no_sync) return fc_fail(e, "--no-sync needs a data-parallel strategy");
        if (c->cpu_offload) return fc_fail(e, "--cpu-offload needs a data-parallel strategy");
        if (c->act_ckpt != FC_ACT_CKPT_NONE)
            return fc_fail(e, "--activation-checkpointing needs a data-parallel strategy (local is the ground truth "
                              "it is checked against)");
        if (c->divide != FC_DIVIDE_PREPOST) return fc_fail(e, "--divide needs a data-parallel strategy");
        if (c->inject != FC_FAULT_NONE)
            return fc_fail(e, "--inject needs a data-parallel strategy (local is the ground truth)");
    }
    return 0;
}

int fc_run_config_validate_world(const fc_run_config *c, int world, fc_error *e) {
    if (c->strategy == FC_STRATEGY_LOCAL && world != 1)
        return fc_fail(e, "--strategy local runs as one process, not %d", world);
    int F = c->shard_group ? c->shard_group : world;
    if (F > world || world % F != 0)
        return fc_fail(e, "--shard-group %d does not divide the world size %d", F, world);
    int R = c->reshard_after_forward;
    if (R && (R >= F || F % R != 0))
        return fc_fail(e, "--reshard-after-forward %d must divide the shard group's %d ranks and be smaller (%d is "
                          "reshard_after_forward=True: leave it out)", R, F, F);
    // Every rank is a data-parallel rank: each takes B/W samples, in K micro-batches.
    if (c->global_batch % world != 0)
        return fc_fail(e, "--global-batch %d is not divisible by the data-parallel size %d",
                       c->global_batch, world);
    if ((c->global_batch / world) % c->grad_accum != 0)
        return fc_fail(e, "per-rank batch %d is not divisible by --grad-accum %d",
                       c->global_batch / world, c->grad_accum);
    return 0;
}

cJSON *fc_run_config_to_json(const fc_run_config *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    cJSON_AddItemToObject(j, "model", fc_model_config_to_json(&c->model));
    cJSON_AddStringToObject(j, "impl", c->impl);
    cJSON_AddStringToObject(j, "comm", fc_comm_name(c->comm));
    cJSON_AddStringToObject(j, "strategy", fc_strategy_name(c->strategy));
    cJSON_AddNumberToObject(j, "fsdp_version", c->fsdp_version);
    cJSON_AddNumberToObject(j, "shard_group", c->shard_group);
    if (c->reshard_after_forward) cJSON_AddNumberToObject(j, "reshard_after_forward", c->reshard_after_forward);
    cJSON_AddStringToObject(j, "backward_prefetch", fc_prefetch_name(c->backward_prefetch));
    cJSON_AddBoolToObject(j, "forward_prefetch", c->forward_prefetch);
    // written only when set, so traces and checkpoints without them read as before
    if (c->forward_prefetch > 1) cJSON_AddNumberToObject(j, "forward_prefetch_units", c->forward_prefetch);
    if (c->backward_prefetch_depth) cJSON_AddNumberToObject(j, "backward_prefetch_units", c->backward_prefetch_depth);
    if (c->gradient_divide_factor > 0) cJSON_AddNumberToObject(j, "gradient_divide_factor", c->gradient_divide_factor);
    cJSON_AddBoolToObject(j, "limit_all_gathers", c->limit_all_gathers);
    cJSON_AddStringToObject(j, "param_dtype", fc_prec_name(c->param_dtype));
    cJSON_AddStringToObject(j, "reduce_dtype", fc_prec_name(c->reduce_dtype));
    cJSON_AddStringToObject(j, "divide", fc_divide_name(c->divide));
    cJSON_AddNumberToObject(j, "grad_accum", c->grad_accum);
    cJSON_AddBoolToObject(j, "no_sync", c->no_sync);
    cJSON_AddNumberToObject(j, "clip_grad_norm", c->clip_grad_norm);
    cJSON_AddStringToObject(j, "norm_type", fc_norm_name(c->norm_type));
    cJSON_AddBoolToObject(j, "cpu_offload", c->cpu_offload);
    cJSON_AddStringToObject(j, "activation_checkpointing", fc_act_ckpt_name(c->act_ckpt));
    cJSON *o = cJSON_AddObjectToObject(j, "optimizer");
    cJSON_AddStringToObject(o, "kind", fc_opt_name(c->optim.kind));
    cJSON_AddNumberToObject(o, "lr", c->optim.lr);
    cJSON_AddNumberToObject(o, "weight_decay", c->optim.weight_decay);
    cJSON_AddNumberToObject(o, "beta1", c->optim.beta1);
    cJSON_AddNumberToObject(o, "beta2", c->optim.beta2);
    cJSON_AddNumberToObject(o, "eps", c->optim.eps);
    cJSON_AddNumberToObject(o, "momentum", c->optim.momentum);
    cJSON_AddNumberToObject(o, "dampening", c->optim.dampening);
    cJSON_AddBoolToObject(o, "nesterov", c->optim.nesterov);
    cJSON_AddNumberToObject(j, "steps", c->steps);
    cJSON_AddNumberToObject(j, "global_batch", c->global_batch);
    cJSON_AddNumberToObject(j, "seq_len", c->seq_len);
    // seeds are 64-bit: a JSON number (double) would lose bits, so write a string
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
    cJSON_AddStringToObject(j, "seed", seed);
    cJSON_AddStringToObject(j, "init", c->init_path);
    cJSON_AddStringToObject(j, "inject", fc_fault_name(c->inject));
    cJSON_AddStringToObject(j, "freeze", c->freeze);
    return j;
}

// Field readers for fc_run_config_from_json: each checks type and presence.
static int jnum(const cJSON *j, const char *k, double *out, fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!cJSON_IsNumber(v)) return fc_fail(e, "config: \"%s\" missing or not a number", k);
    *out = v->valuedouble;
    return 0;
}
static int jint(const cJSON *j, const char *k, int *out, fc_error *e) {
    double d = 0;
    if (jnum(j, k, &d, e)) return -1;
    if (d != floor(d) || fabs(d) > 2e9) return fc_fail(e, "config: \"%s\" is not an integer", k);
    *out = (int)d;
    return 0;
}
static int jflt(const cJSON *j, const char *k, float *out, fc_error *e) {
    double d = 0;
    if (jnum(j, k, &d, e)) return -1;
    *out = (float)d;
    return 0;
}
static int jbool(const cJSON *j, const char *k, int *out, fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!cJSON_IsBool(v)) return fc_fail(e, "config: \"%s\" missing or not a boolean", k);
    *out = cJSON_IsTrue(v);
    return 0;
}
static const char *jstr(const cJSON *j, const char *k, fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!cJSON_IsString(v)) {
        fc_fail(e, "config: \"%s\" missing or not a string", k);
        return NULL;
    }
    return v->valuestring;
}
#define JENUM(obj, fn, key, dst)                                                       \
    do {                                                                          \
        const char *s_ = jstr(obj, key, e);                                         \
        if (!s_) return -1;                                                       \
        if (fc_##fn##_parse(s_, dst)) return fc_fail(e, "config: bad \"%s\": \"%s\"", key, s_); \
    } while (0)

int fc_run_config_from_json(const cJSON *j, fc_run_config *c, fc_error *e) {
    fc_run_config_defaults(c);
    if (!cJSON_IsObject(j)) return fc_fail(e, "config: not a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!cJSON_IsObject(model)) return fc_fail(e, "config: \"model\" missing");
    char *mtext = cJSON_PrintUnformatted(model);
    if (!mtext) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    const cJSON *mname = cJSON_GetObjectItemCaseSensitive(model, "fsdpcheck_name");
    int rc = fc_model_config_parse(mtext, cJSON_IsString(mname) ? mname->valuestring : "config",
                                   &c->model, e);
    free(mtext);
    if (rc) return -1;
    const char *impl = jstr(j, "impl", e);
    if (!impl) return -1;
    snprintf(c->impl, sizeof c->impl, "%s", impl);
    // "comm" is optional: configs written before the CUDA port have none (auto)
    if (cJSON_GetObjectItemCaseSensitive(j, "comm")) JENUM(j, comm, "comm", &c->comm);
    JENUM(j, strategy, "strategy", &c->strategy);
    // "fsdp_version" is optional: configs written before FSDP2 have none (1)
    c->fsdp_version = 1;
    if (cJSON_GetObjectItemCaseSensitive(j, "fsdp_version") && jint(j, "fsdp_version", &c->fsdp_version, e)) return -1;
    // "activation_checkpointing" is optional: configs written before it have none
    c->act_ckpt = FC_ACT_CKPT_NONE;
    if (cJSON_GetObjectItemCaseSensitive(j, "activation_checkpointing"))
        JENUM(j, act_ckpt, "activation_checkpointing", &c->act_ckpt);
    // "reshard_after_forward" is written only when it is an integer R
    if (cJSON_GetObjectItemCaseSensitive(j, "reshard_after_forward") &&
        jint(j, "reshard_after_forward", &c->reshard_after_forward, e))
        return -1;
    // FSDP2's prefetch lists and divide factor: written only when set
    c->backward_prefetch_depth = 0;
    if (cJSON_GetObjectItemCaseSensitive(j, "backward_prefetch_units") &&
        jint(j, "backward_prefetch_units", &c->backward_prefetch_depth, e))
        return -1;
    c->gradient_divide_factor = 0;
    if (cJSON_GetObjectItemCaseSensitive(j, "gradient_divide_factor") &&
        jnum(j, "gradient_divide_factor", &c->gradient_divide_factor, e))
        return -1;
    JENUM(j, prefetch, "backward_prefetch", &c->backward_prefetch);
    JENUM(j, prec, "param_dtype", &c->param_dtype);
    JENUM(j, prec, "reduce_dtype", &c->reduce_dtype);
    JENUM(j, divide, "divide", &c->divide);
    JENUM(j, norm, "norm_type", &c->norm_type);
    if (jint(j, "shard_group", &c->shard_group, e) || jbool(j, "forward_prefetch", &c->forward_prefetch, e) ||
        jbool(j, "limit_all_gathers", &c->limit_all_gathers, e) ||
        jint(j, "grad_accum", &c->grad_accum, e) || jbool(j, "no_sync", &c->no_sync, e) ||
        jflt(j, "clip_grad_norm", &c->clip_grad_norm, e) ||
        jbool(j, "cpu_offload", &c->cpu_offload, e) || jint(j, "steps", &c->steps, e) ||
        jint(j, "global_batch", &c->global_batch, e) || jint(j, "seq_len", &c->seq_len, e))
        return -1;
    if (c->forward_prefetch && cJSON_GetObjectItemCaseSensitive(j, "forward_prefetch_units") &&
        jint(j, "forward_prefetch_units", &c->forward_prefetch, e))
        return -1;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    if (!cJSON_IsObject(o)) return fc_fail(e, "config: \"optimizer\" missing");
    JENUM(o, opt, "kind", &c->optim.kind);
    if (jnum(o, "lr", &c->optim.lr, e) || jnum(o, "weight_decay", &c->optim.weight_decay, e) ||
        jnum(o, "beta1", &c->optim.beta1, e) || jnum(o, "beta2", &c->optim.beta2, e) ||
        jnum(o, "eps", &c->optim.eps, e) || jnum(o, "momentum", &c->optim.momentum, e) ||
        jnum(o, "dampening", &c->optim.dampening, e) || jbool(o, "nesterov", &c->optim.nesterov, e))
        return -1;
    const char *seed = jstr(j, "seed", e);
    if (!seed) return -1;
    char *end;
    errno = 0;
    unsigned long long s = strtoull(seed, &end, 10);
    if (errno || *end || !*seed || seed[0] == '-') return fc_fail(e, "config: bad \"seed\": \"%s\"", seed);
    c->seed = s;
    const char *init = jstr(j, "init", e);
    if (!init) return -1;
    snprintf(c->init_path, sizeof c->init_path, "%s", init);
    // "inject" is optional: configs written before the fault catalogue have none
    if (cJSON_GetObjectItemCaseSensitive(j, "inject")) JENUM(j, fault, "inject", &c->inject);
    // "freeze" is optional: configs written before frozen parameters have none
    if (cJSON_GetObjectItemCaseSensitive(j, "freeze")) {
        const char *fz = jstr(j, "freeze", e);
        if (!fz) return -1;
        if (snprintf(c->freeze, sizeof c->freeze, "%s", fz) >= (int)sizeof c->freeze)
            return fc_fail(e, "config: \"freeze\" is longer than %zu characters", sizeof c->freeze - 1);
    }
    return fc_run_config_validate(c, e);
}
