// core/config_json.c — the run config as JSON (trace.json's and a
// checkpoint manifest's "config") and back, every field checked. See config.h.
#include "config.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// "model" (a config.json), "impl", then the strategy and the keys written only
// by newer versions or only when set (older configs read as before).
static int read_model_and_strategy(const cJSON *j, fc_run_config *c, fc_error *e) {
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
    return 0;
}

// The policy's enums and the run's sizes and switches, then "optimizer".
static int read_policy_and_optimizer(const cJSON *j, fc_run_config *c, fc_error *e) {
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
    return 0;
}

// "seed" (a string: 64 bits), "init", and the optional "inject" and "freeze".
static int read_seed_and_extras(const cJSON *j, fc_run_config *c, fc_error *e) {
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
    return 0;
}

int fc_run_config_from_json(const cJSON *j, fc_run_config *c, fc_error *e) {
    fc_run_config_defaults(c);
    if (!cJSON_IsObject(j)) return fc_fail(e, "config: not a JSON object");
    if (read_model_and_strategy(j, c, e) || read_policy_and_optimizer(j, c, e) || read_seed_and_extras(j, c, e))
        return -1;
    return fc_run_config_validate(c, e);
}
