// fuzz/fuzz_config.c — libFuzzer harness for the JSON config readers of
// config.c: a model config.json (fc_model_config_parse, `run --model FILE`)
// and the run config trace.json and checkpoints carry (fc_run_config_from_json).
// Every input goes to both. (fsdp_config.json has its own harness,
// fuzz_fsdp_config.c.)
//
// Whatever one accepts must be usable: a model config validates and survives
// a round trip through its JSON; a run config round-trips to the same JSON
// text. A refusal leaves a message.
#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

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
    run_config(data, size);
    return 0;
}
