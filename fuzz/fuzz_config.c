// fuzz/fuzz_config.c — libFuzzer harness for the three JSON config readers:
// a model config.json (fc_model_config_parse), a Hugging Face fsdp_config.json
// (fc_fsdp_config_parse) and the run config trace.json and checkpoints carry
// (fc_run_config_from_json). Every input goes to all three.
//
// Whatever one accepts must be usable: a model config validates and survives
// a round trip through its JSON; an fsdp_config applies to a run config
// without leaving any field out of range, and its wrap classes check against
// both presets; a run config round-trips to the same JSON text. A refusal
// leaves a message (one line, for fsdp_config's own messages).
#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fsdp_config.h"

static void check(int ok) {
    if (!ok) abort();
}

static void model_config(const char *text) {
    fc_model_config m, back;
    fc_error e;
    e.msg[0] = '\0';
    if (fc_model_config_parse(text, "config.json", &m, &e) != 0) {
        check(e.msg[0] != '\0');
        return;
    }
    check(fc_model_config_validate(&m, &e) == 0);
    cJSON *j = fc_model_config_to_json(&m);
    char *again = cJSON_PrintUnformatted(j);
    check(again != NULL);
    check(fc_model_config_parse(again, "round-trip", &back, &e) == 0);
    check(fc_model_config_equal(&m, &back));
    free(again);
    cJSON_Delete(j);
}

static void fsdp_config(const uint8_t *data, size_t size) {
    fc_fsdp_config f;
    fc_error e;
    e.msg[0] = '\0';
    if (fc_fsdp_config_parse((const char *)data, size, "fsdp_config.json", &f, &e) != 0) {
        check(e.msg[0] != '\0' && strchr(e.msg, '\n') == NULL);
        return;
    }
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_fsdp_config_apply(&f, &c);
    check((unsigned)c.strategy < FC_STRATEGY_COUNT);
    check(c.backward_prefetch == FC_PREFETCH_NONE || c.backward_prefetch == FC_PREFETCH_PRE ||
          c.backward_prefetch == FC_PREFETCH_POST);
    check(c.param_dtype == FC_PREC_FP32 || c.param_dtype == FC_PREC_BF16 || c.param_dtype == FC_PREC_FP16);
    check(c.reduce_dtype == FC_PREC_FP32 || c.reduce_dtype == FC_PREC_BF16 || c.reduce_dtype == FC_PREC_FP16);
    check((c.forward_prefetch | c.cpu_offload | c.limit_all_gathers) <= 1);
    check(f.state_dict == FC_FSDP_SD_UNSET || f.state_dict == FC_FSDP_SD_FULL || f.state_dict == FC_FSDP_SD_SHARDED);
    check(f.n_wrap_cls >= 0 && f.n_wrap_cls <= FC_FSDP_MAX_WRAP_CLS);
    fc_model_config mlp, gpt2;
    check(fc_model_config_load("mlp-tiny", &mlp, &e) == 0 && fc_model_config_load("gpt2-tiny", &gpt2, &e) == 0);
    int ok_mlp = fc_fsdp_config_check_model(&f, &mlp, &e) == 0;
    int ok_gpt2 = fc_fsdp_config_check_model(&f, &gpt2, &e) == 0;
    check(ok_mlp || ok_gpt2 || f.n_wrap_cls > 1);  // one class name fits exactly one model kind
    if (f.n_wrap_cls == 0) check(ok_mlp && ok_gpt2);
}

static void run_config(const uint8_t *data, size_t size) {
    cJSON *j = cJSON_ParseWithLength((const char *)data, size);
    if (!j) return;
    fc_run_config c, back;
    fc_error e;
    e.msg[0] = '\0';
    if (fc_run_config_from_json(j, &c, &e) != 0) {
        check(e.msg[0] != '\0');
        cJSON_Delete(j);
        return;
    }
    check(fc_run_config_validate(&c, &e) == 0);
    cJSON *out = fc_run_config_to_json(&c);
    check(fc_run_config_from_json(out, &back, &e) == 0);
    cJSON *out2 = fc_run_config_to_json(&back);
    char *t1 = cJSON_PrintUnformatted(out), *t2 = cJSON_PrintUnformatted(out2);
    check(t1 && t2 && strcmp(t1, t2) == 0);  // the JSON form is a fixed point
    free(t1);
    free(t2);
    cJSON_Delete(out);
    cJSON_Delete(out2);
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    char *text = malloc(size + 1);
    check(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';
    model_config(text);
    free(text);
    fsdp_config(data, size);
    run_config(data, size);
    return 0;
}
