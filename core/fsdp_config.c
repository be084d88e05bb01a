// core/fsdp_config.c — Hugging Face fsdp_config.json -> fc_run_config. See fsdp_config.h.
#include "fsdp_config.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fileio.h"

#define FSDP_CONFIG_MAX (1u << 20)

// Parser state: the output, plus what cross-key checks need after every key.
typedef struct {
    const char *path;
    fc_fsdp_config *out;
    int sync_module_states;         // -1 absent, else the value
    int cpu_ram_efficient_loading;  // -1 absent, else the value
    int mp_param_set;               // "mixed_precision" gave a param dtype
    fc_prec mp_param;
    int policy_param_set;           // "mixed_precision_policy" gave one
    fc_prec policy_param;
} parse_state;

// ---------------------------------------------------------------------------
// message helpers: a key or value is shown as JSON, escaped and shortened, so a
// message stays one line whatever the file holds

static void quote(const char *s, char *buf, size_t cap) {
    size_t k = 0;
    buf[k++] = '"';
    for (; *s && k + 8 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') k += (size_t)snprintf(buf + k, cap - k, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) k += (size_t)snprintf(buf + k, cap - k, "\\u%04x", ch);
        else buf[k++] = (char)ch;
    }
    if (*s) k += (size_t)snprintf(buf + k, cap - k, "...");
    snprintf(buf + k, cap - k, "\"");
}

static void show(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsString(v)) {
        quote(v->valuestring, buf, cap);
        return;
    }
    char *text = cJSON_PrintUnformatted(v);
    if (!text) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    if (strlen(text) + 1 > cap && cap > 4) snprintf(buf, cap, "%.*s...", (int)(cap - 4), text);
    else snprintf(buf, cap, "%s", text);
    free(text);
}

// "<file>: "<key>": <value> <why>"
static int bad_value(const parse_state *ps, const char *key, const cJSON *v, const char *why, fc_error *e) {
    char k[96], val[96];
    quote(key, k, sizeof k);
    show(v, val, sizeof val);
    return fc_fail(e, "%s: %s: %s %s", ps->path, k, val, why);
}

// ---------------------------------------------------------------------------
// value readers

static int get_bool(const cJSON *v, int *out) {
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return 0;
    }
    if (cJSON_IsString(v) && (!strcasecmp(v->valuestring, "true") || !strcasecmp(v->valuestring, "false"))) {
        *out = !strcasecmp(v->valuestring, "true");
        return 0;
    }
    return -1;
}

// An integer as a JSON number or a string of digits (Accelerate writes both).
static int get_int(const cJSON *v, long *out) {
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d != floor(d) || fabs(d) > 1e9) return -1;
        *out = (long)d;
        return 0;
    }
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        size_t n = strlen(s);
        if (n == 0 || n > 9 || strspn(s, "0123456789") != n) return -1;
        *out = strtol(s, NULL, 10);
        return 0;
    }
    return -1;
}

// Index of a case-insensitive name in names (NULL-terminated), -1 if none.
static int get_name(const cJSON *v, const char *const *names) {
    if (!cJSON_IsString(v)) return -1;
    for (int i = 0; names[i]; i++)
        if (!strcasecmp(v->valuestring, names[i])) return i;
    return -1;
}

static int bool_key(parse_state *ps, const char *key, const cJSON *v, int *has, int *dst, fc_error *e) {
    if (get_bool(v, dst)) return bad_value(ps, key, v, "is not a boolean (true, false, \"true\" or \"false\")", e);
    if (has) *has = 1;
    return 0;
}

// ---------------------------------------------------------------------------
// one handler per key

typedef int (*key_fn)(parse_state *ps, const char *key, const cJSON *v, fc_error *e);

static int k_sharding_strategy(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    // Accelerate's FSDP_SHARDING_STRATEGY order, which its integers 1..5 index;
    // torch spells the last one _HYBRID_SHARD_ZERO2.
    static const char *const names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                        "HYBRID_SHARD_ZERO2", "_HYBRID_SHARD_ZERO2", NULL};
    static const fc_strategy map[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_NO_SHARD,
                                      FC_STRATEGY_HYBRID_SHARD, FC_STRATEGY_HYBRID_SHARD_ZERO2,
                                      FC_STRATEGY_HYBRID_SHARD_ZERO2};
    int i = get_name(v, names);
    long n = 0;
    if (i < 0 && get_int(v, &n) == 0 && n >= 1 && n <= 5) i = (int)n - 1;
    if (i < 0)
        return bad_value(ps, key, v,
                         "is not a sharding strategy: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, "
                         "HYBRID_SHARD_ZERO2 or 1..5",
                         e);
    ps->out->has_strategy = 1;
    ps->out->strategy = map[i];
    return 0;
}

static int k_backward_prefetch(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    static const char *const names[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH", NULL};
    static const fc_prefetch map[] = {FC_PREFETCH_PRE, FC_PREFETCH_POST, FC_PREFETCH_NONE};
    int i = get_name(v, names);
    if (i < 0) return bad_value(ps, key, v, "is not BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH", e);
    ps->out->has_backward_prefetch = 1;
    ps->out->backward_prefetch = map[i];
    return 0;
}

static int k_forward_prefetch(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    return bool_key(ps, key, v, &ps->out->has_forward_prefetch, &ps->out->forward_prefetch, e);
}

static int k_offload_params(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    return bool_key(ps, key, v, &ps->out->has_cpu_offload, &ps->out->cpu_offload, e);
}

static int k_limit_all_gathers(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    return bool_key(ps, key, v, &ps->out->has_limit_all_gathers, &ps->out->limit_all_gathers, e);
}

static int k_state_dict_type(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    // torch's StateDictType: FULL_STATE_DICT = 1, LOCAL_STATE_DICT = 2, SHARDED_STATE_DICT = 3
    static const char *const names[] = {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT", NULL};
    int i = get_name(v, names);
    long n = 0;
    if (i < 0 && get_int(v, &n) == 0 && n >= 1 && n <= 3) i = (int)n - 1;
    if (i == 1)
        return bad_value(ps, key, v,
                         "is not supported: LOCAL_STATE_DICT checkpoints are rank-local flat buffers that load "
                         "only at the same world size; fsdpcheck writes FULL_STATE_DICT or SHARDED_STATE_DICT",
                         e);
    if (i < 0) return bad_value(ps, key, v, "is not FULL_STATE_DICT or SHARDED_STATE_DICT (or 1, 3)", e);
    ps->out->state_dict = i == 0 ? FC_FSDP_SD_FULL : FC_FSDP_SD_SHARDED;
    return 0;
}

static int k_auto_wrap_policy(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    static const char *const names[] = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP", NULL};
    int i = get_name(v, names);
    if (i == 1)
        return bad_value(ps, key, v,
                         "is not supported: size-based wrapping puts unit boundaries by parameter count; "
                         "fsdpcheck's units are one per transformer block (gpt2, llama) or Linear layer (mlp): use "
                         "TRANSFORMER_BASED_WRAP",
                         e);
    if (i == 2)
        return bad_value(ps, key, v,
                         "is not supported: NO_WRAP makes the whole model one unit; fsdpcheck's units are one "
                         "per transformer block (gpt2, llama) or Linear layer (mlp): use TRANSFORMER_BASED_WRAP",
                         e);
    if (i < 0)
        return bad_value(ps, key, v, "is not TRANSFORMER_BASED_WRAP (the only policy matching fsdpcheck's units)", e);
    return 0;
}

static int add_wrap_cls(parse_state *ps, const char *key, const cJSON *v, const char *name, size_t len,
                        fc_error *e) {
    fc_fsdp_config *o = ps->out;
    while (len && (*name == ' ' || *name == '\t')) name++, len--;
    while (len && (name[len - 1] == ' ' || name[len - 1] == '\t')) len--;
    if (len == 0)
        return bad_value(ps, key, v,
                         "holds an empty class name (accepted: GPT2Block for gpt2, LlamaDecoderLayer for llama, "
                         "Linear for mlp)",
                         e);
    int known = 0;
    for (fc_model_kind k = FC_MODEL_MLP; k <= FC_MODEL_LLAMA; k++) {
        const char *cls = fc_model_unit_class(k);
        known |= strlen(cls) == len && !strncmp(name, cls, len);
    }
    if (!known)
        return bad_value(ps, key, v,
                         "names a class that is not a unit of fsdpcheck's models (accepted: GPT2Block for gpt2, "
                         "LlamaDecoderLayer for llama, Linear for mlp)",
                         e);
    if (o->n_wrap_cls == FC_FSDP_MAX_WRAP_CLS) return bad_value(ps, key, v, "lists too many classes", e);
    snprintf(o->wrap_cls[o->n_wrap_cls++], sizeof o->wrap_cls[0], "%.*s", (int)len, name);
    return 0;
}

static int k_wrap_cls(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    // Accelerate takes a comma-separated string, Transformers a string or a list.
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        for (;;) {
            const char *comma = strchr(s, ',');
            size_t len = comma ? (size_t)(comma - s) : strlen(s);
            if (add_wrap_cls(ps, key, v, s, len, e)) return -1;
            if (!comma) return 0;
            s = comma + 1;
        }
    }
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (!cJSON_IsString(it)) return bad_value(ps, key, v, "must be a string or a list of strings", e);
            if (add_wrap_cls(ps, key, v, it->valuestring, strlen(it->valuestring), e)) return -1;
        }
        return 0;
    }
    return bad_value(ps, key, v,
                     "must be a class name or a non-empty list of them (GPT2Block for gpt2, LlamaDecoderLayer for "
                     "llama, Linear for mlp)",
                     e);
}

static int k_min_num_params(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    long n = -1;
    if (get_int(v, &n) || n < 0) return bad_value(ps, key, v, "is not a non-negative integer", e);
    if (n != 0)
        return bad_value(ps, key, v,
                         "is not supported: a nonzero min_num_params wraps by size, which does not match "
                         "fsdpcheck's units (one per transformer block / Linear layer); use 0",
                         e);
    return 0;
}

// Keys whose every value leaves the results unchanged in fsdpcheck.
static int k_use_orig_params(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    // Only how parameters are exposed to the optimizer (views vs the flat
    // buffer); fsdpcheck's optimizers are per element with one parameter group.
    int x;
    return bool_key(ps, key, v, NULL, &x, e);
}

static int k_sync_module_states(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    // Broadcasting rank 0's weights changes nothing: the initial weights are a
    // pure function of (seed, name, index), the same bits on every rank.
    return bool_key(ps, key, v, NULL, &ps->sync_module_states, e);
}

static int k_cpu_ram_efficient_loading(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    // Loading on rank 0 only, then syncing: the same weights everywhere.
    return bool_key(ps, key, v, NULL, &ps->cpu_ram_efficient_loading, e);
}

// Accelerate's fsdp_activation_checkpointing runs apply_activation_checkpointing
// after wrapping, whose check_fn matches the layer inside each FSDP unit, and
// XLA's xla_fsdp_grad_ckpt wraps FSDP(checkpoint_module(layer)): both put the
// checkpoint inside the unit. false leaves it off.
static int k_activation_checkpointing(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    int x = 0;
    if (bool_key(ps, key, v, NULL, &x, e)) return -1;
    ps->out->has_act_ckpt = 1;
    ps->out->act_ckpt = x ? FC_ACT_CKPT_INSIDE : FC_ACT_CKPT_NONE;
    return 0;
}

static int k_version(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    long n = 0;
    if (get_int(v, &n) || (n != 1 && n != 2))
        return bad_value(ps, key, v, "is not an FSDP version (accepted: 1, 2)", e);
    ps->out->has_version = 1;
    ps->out->version = (int)n;
    return 0;
}

// FSDP2's fully_shard(reshard_after_forward=): true frees a unit's gathered
// parameters after forward (FULL_SHARD), false keeps them (SHARD_GRAD_OP)
static int k_reshard_after_forward(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    long n;
    if (cJSON_IsNumber(v) && get_int(v, &n) == 0) {  // an integer R: a 1/R slice kept after forward
        if (n < 2 || n > 1 << 20)
            return bad_value(ps, key, v, "is not a group size R >= 2 (accepted: true, false, an integer R >= 2)", e);
        ps->out->has_reshard_after_forward = 1;
        ps->out->reshard_after_forward = 1;
        ps->out->reshard_after_forward_r = (int)n;
        return 0;
    }
    return bool_key(ps, key, v, &ps->out->has_reshard_after_forward, &ps->out->reshard_after_forward, e);
}

static int k_xla(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    int x = 0;
    if (bool_key(ps, key, v, NULL, &x, e)) return -1;
    if (x)
        return bad_value(ps, key, v,
                         "is an XLA FSDP run, which only the PyTorch adapter on the XLA device judges "
                         "(fsdpcheck-torch run --device xla); here accepted: false",
                         e);
    return 0;
}

static int dtype_name(const char *s, fc_prec *out) {
    static const char *const fp32[] = {"fp32", "float32", "float", "torch.float32", NULL};
    static const char *const bf16[] = {"bf16", "bfloat16", "torch.bfloat16", NULL};
    static const char *const fp16[] = {"fp16", "float16", "half", "torch.float16", NULL};
    for (int i = 0; fp32[i]; i++)
        if (!strcasecmp(s, fp32[i])) return *out = FC_PREC_FP32, 0;
    for (int i = 0; bf16[i]; i++)
        if (!strcasecmp(s, bf16[i])) return *out = FC_PREC_BF16, 0;
    for (int i = 0; fp16[i]; i++)
        if (!strcasecmp(s, fp16[i])) return *out = FC_PREC_FP16, 0;
    return -1;
}

static int k_mixed_precision(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    static const char *const names[] = {"no", "fp32", "bf16", "fp16", "fp8", NULL};
    int i = get_name(v, names);
    if (i == 4)
        return bad_value(ps, key, v, "is not supported: fp8 training is not modelled (accepted: no, bf16, fp16)", e);
    if (i < 0) return bad_value(ps, key, v, "is not a mixed precision (accepted: no, fp32, bf16, fp16)", e);
    fc_prec p = i <= 1 ? FC_PREC_FP32 : i == 2 ? FC_PREC_BF16 : FC_PREC_FP16;
    // Accelerate's FSDP MixedPrecision(param_dtype=p, reduce_dtype=p): the same
    // as --param-dtype p, whose reduce dtype follows it unless given.
    ps->mp_param_set = 1;
    ps->mp_param = p;
    ps->out->has_param_dtype = 1;
    ps->out->param_dtype = p;
    return 0;
}

static int k_mixed_precision_policy(parse_state *ps, const char *key, const cJSON *v, fc_error *e) {
    if (!cJSON_IsObject(v))
        return bad_value(ps, key, v, "must be an object with param_dtype, reduce_dtype, buffer_dtype", e);
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s.%s", key, it->string);
        int which = !strcmp(it->string, "param_dtype") ? 0 : !strcmp(it->string, "reduce_dtype") ? 1
                  : !strcmp(it->string, "buffer_dtype") ? 2 : -1;
        if (which < 0)
            return bad_value(ps, sub, it,
                             "is not a key of a mixed precision policy (accepted: param_dtype, reduce_dtype, "
                             "buffer_dtype)",
                             e);
        fc_prec p;
        if (!cJSON_IsString(it) || dtype_name(it->valuestring, &p))
            return bad_value(ps, sub, it, "is not a dtype (accepted: float32, bfloat16, float16, fp32, bf16, fp16)", e);
        // buffer_dtype: fsdpcheck's models have no buffers, so any dtype is the same run
        if (which == 0) {
            ps->policy_param_set = 1;
            ps->policy_param = p;
            ps->out->has_param_dtype = 1;
            ps->out->param_dtype = p;
        }
        if (which == 1) ps->out->has_reduce_dtype = 1, ps->out->reduce_dtype = p;
    }
    return 0;
}

typedef struct {
    const char *name;  // without the fsdp_ prefix
    key_fn fn;
    const char *same_as;  // an alias: the canonical name (duplicates are refused)
} key_spec;

static const key_spec KEYS[] = {
    {"sharding_strategy", k_sharding_strategy, NULL},
    {"backward_prefetch", k_backward_prefetch, NULL},
    {"backward_prefetch_policy", k_backward_prefetch, "backward_prefetch"},
    {"forward_prefetch", k_forward_prefetch, NULL},
    {"offload_params", k_offload_params, NULL},
    {"limit_all_gathers", k_limit_all_gathers, NULL},
    {"state_dict_type", k_state_dict_type, NULL},
    {"auto_wrap_policy", k_auto_wrap_policy, NULL},
    {"transformer_layer_cls_to_wrap", k_wrap_cls, NULL},
    {"min_num_params", k_min_num_params, NULL},
    {"use_orig_params", k_use_orig_params, NULL},
    {"sync_module_states", k_sync_module_states, NULL},
    {"cpu_ram_efficient_loading", k_cpu_ram_efficient_loading, NULL},
    {"activation_checkpointing", k_activation_checkpointing, NULL},
    {"xla_fsdp_grad_ckpt", k_activation_checkpointing, "activation_checkpointing"},
    {"version", k_version, NULL},
    {"reshard_after_forward", k_reshard_after_forward, NULL},
    {"xla", k_xla, NULL},
    {"mixed_precision", k_mixed_precision, NULL},
    {"mixed_precision_policy", k_mixed_precision_policy, NULL},
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const char ACCEPTED_KEYS[] =
    "sharding_strategy, backward_prefetch, forward_prefetch, offload_params, limit_all_gathers, state_dict_type, "
    "auto_wrap_policy, transformer_layer_cls_to_wrap, min_num_params, use_orig_params, sync_module_states, "
    "cpu_ram_efficient_loading, activation_checkpointing, xla_fsdp_grad_ckpt, version, reshard_after_forward, xla, mixed_precision, "
    "mixed_precision_policy";

// FSDP1's keys, which a version-2 config may not hold (Accelerate's to-fsdp2
// drops or renames them: sharding_strategy becomes reshard_after_forward)
static const char *const FSDP1_ONLY[] = {"sharding_strategy", "backward_prefetch", "forward_prefetch",
                                         "limit_all_gathers", "use_orig_params", "sync_module_states", NULL};

static int fsdp1_only(const char *canonical_name) {
    for (int i = 0; FSDP1_ONLY[i]; i++)
        if (!strcmp(canonical_name, FSDP1_ONLY[i])) return 1;
    return 0;
}

static int find_key(const char *key) {
    const char *k = strncmp(key, "fsdp_", 5) == 0 ? key + 5 : key;
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(k, KEYS[i].name)) return i;
    return -1;
}

static const char *canonical(int i) {
    return KEYS[i].same_as ? KEYS[i].same_as : KEYS[i].name;
}

// The keys read so far: each one's canonical name, and as the file spells it.
typedef struct {
    const char *name[N_KEYS];
    const char *as[N_KEYS];
    int n;
} seen_keys;

// Each key of j, known, given once, and read into ps by its key_fn.
static int read_keys(const cJSON *j, parse_state *ps, seen_keys *seen, fc_error *e) {
    const char *path = ps->path;
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        const char *key = it->string;
        char k[96];
        quote(key, k, sizeof k);
        if (!strcmp(key, "fsdp_config"))
            return fc_fail(e, "%s: %s holds a whole Accelerate config; pass its \"fsdp_config\" section (with "
                              "\"mixed_precision\" beside the fsdp_* keys) as the file",
                           path, k);
        int i = find_key(key);
        if (i < 0) {
            char val[96];
            show(it, val, sizeof val);
            return fc_fail(e, "%s: unknown key %s (value %s); accepted keys, fsdp_ prefix optional: %s", path, k,
                           val, ACCEPTED_KEYS);
        }
        // the same setting twice (with and without the prefix, or under its
        // older name) is ambiguous: JSON objects have no order to settle it
        for (int s = 0; s < seen->n; s++) {
            if (strcmp(seen->name[s], canonical(i)) != 0) continue;
            char other[96];
            quote(seen->as[s], other, sizeof other);
            return fc_fail(e, "%s: %s and %s set the same thing: give it once", path, other, k);
        }
        seen->name[seen->n] = canonical(i);
        seen->as[seen->n++] = key;
        if (KEYS[i].fn(ps, key, it, e)) return -1;
    }
    return 0;
}

// The rules across keys, as Accelerate enforces them.
static int cross_key_rules(const parse_state *ps, const seen_keys *seen, fc_error *e) {
    const char *path = ps->path;
    const fc_fsdp_config *out = ps->out;
    for (int s = 0; s < seen->n; s++) {
        char k[96];
        quote(seen->as[s], k, sizeof k);
        if (out->version == 2 && fsdp1_only(seen->name[s]))
            return fc_fail(e, "%s: %s is an FSDP1 key, refused with \"fsdp_version\": 2 (FSDP2 has %s)", path, k,
                           !strcmp(seen->name[s], "sharding_strategy")
                               ? "fsdp_reshard_after_forward instead"
                               : "no such option; Accelerate refuses or drops it");
        if (out->version != 2 && !strcmp(seen->name[s], "reshard_after_forward"))
            return fc_fail(e, "%s: %s is an FSDP2 key: add \"fsdp_version\": 2, or use fsdp_sharding_strategy", path,
                           k);
    }
    if (out->version != 2 && ps->cpu_ram_efficient_loading == 1 && ps->sync_module_states == 0)
        return fc_fail(e, "%s: \"fsdp_cpu_ram_efficient_loading\": true needs \"fsdp_sync_module_states\": true (the "
                          "other ranks would start from empty weights)",
                       path);
    if (ps->mp_param_set && ps->policy_param_set && ps->mp_param != ps->policy_param)
        return fc_fail(e, "%s: \"mixed_precision\" (%s) and \"mixed_precision_policy\".param_dtype (%s) disagree",
                       path, fc_prec_name(ps->mp_param), fc_prec_name(ps->policy_param));
    return 0;
}

int fc_fsdp_config_parse(const char *text, size_t len, const char *path, fc_fsdp_config *out, fc_error *e) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    if (memchr(text, '\0', len)) return fc_fail(e, "%s: not valid JSON (contains a NUL byte)", path);
    char *buf = mallocCheck(len + 1);
    memcpy(buf, text, len);
    buf[len] = '\0';
    cJSON *j = cJSON_ParseWithOpts(buf, NULL, 1);
    free(buf);
    if (!j) return fc_fail(e, "%s: not valid JSON", path);
    parse_state ps = {path, out, -1, -1, 0, FC_PREC_FP32, 0, FC_PREC_FP32};
    seen_keys seen = {.n = 0};
    int rc = -1;
    if (!cJSON_IsObject(j))
        fc_fail(e, "%s: an fsdp_config must be a JSON object of fsdp_* keys", path);
    else if (!read_keys(j, &ps, &seen, e) && !cross_key_rules(&ps, &seen, e))
        rc = 0;
    cJSON_Delete(j);
    if (rc) {
        char keep[sizeof out->path];
        memcpy(keep, out->path, sizeof keep);
        memset(out, 0, sizeof *out);
        memcpy(out->path, keep, sizeof keep);
    }
    return rc;
}

int fc_fsdp_config_load(const char *path, fc_fsdp_config *out, fc_error *e) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t n;
    fc_error re;  // "PATH: ...", said of the flag
    if (fc_read_file_limited(path, FSDP_CONFIG_MAX, &buf, &n, &re)) return fc_fail(e, "--fsdp-config %s", re.msg);
    int rc = fc_fsdp_config_parse(buf, n, path, out, e);
    free(buf);
    return rc;
}

void fc_fsdp_config_apply(const fc_fsdp_config *f, fc_run_config *c) {
    if (f->has_version) c->fsdp_version = f->version;
    if (f->has_strategy) c->strategy = f->strategy;
    if (f->has_reshard_after_forward) {
        c->strategy = f->reshard_after_forward ? FC_STRATEGY_FULL_SHARD : FC_STRATEGY_SHARD_GRAD_OP;
        c->reshard_after_forward = f->reshard_after_forward_r;
    }
    if (f->has_backward_prefetch) c->backward_prefetch = f->backward_prefetch;
    if (f->has_forward_prefetch) c->forward_prefetch = f->forward_prefetch;
    if (f->has_cpu_offload) c->cpu_offload = f->cpu_offload;
    if (f->has_act_ckpt) c->act_ckpt = f->act_ckpt;
    if (f->has_limit_all_gathers) c->limit_all_gathers = f->limit_all_gathers;
    if (f->has_param_dtype) c->param_dtype = f->param_dtype;
    if (f->has_reduce_dtype) c->reduce_dtype = f->reduce_dtype;
}

int fc_fsdp_config_check_model(const fc_fsdp_config *f, const fc_model_config *m, fc_error *e) {
    const char *want = fc_model_unit_class(m->kind);
    for (int i = 0; i < f->n_wrap_cls; i++)
        if (strcmp(f->wrap_cls[i], want) != 0)
            return fc_fail(e,
                           "%s: \"fsdp_transformer_layer_cls_to_wrap\": \"%s\" is not a unit of model %s (a %s: "
                           "accepted \"%s\")",
                           f->path, f->wrap_cls[i], m->name, fc_model_kind_name(m->kind), want);
    return 0;
}
