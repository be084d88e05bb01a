// fuzz/fuzz_fsdp_config.c — libFuzzer harness for the Hugging Face
// fsdp_config.json reader (core/fsdp_config.c, `run --fsdp-config FILE`).
//
// Whatever it accepts must be usable: applied to a run config it leaves no
// field out of range, and its wrap classes check against both model presets
// (one class name fits exactly one model kind: mlp, gpt2 or llama). A refusal
// says why in one line.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fsdp_config.h"

static void check(int ok) {
    if (!ok) abort();
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
    fc_model_config mlp, gpt2, llama;
    check(fc_model_config_load("mlp-tiny", &mlp, &e) == 0 && fc_model_config_load("gpt2-tiny", &gpt2, &e) == 0 &&
          fc_model_config_load("llama-tiny", &llama, &e) == 0);
    int ok_mlp = fc_fsdp_config_check_model(&f, &mlp, &e) == 0;
    int ok_gpt2 = fc_fsdp_config_check_model(&f, &gpt2, &e) == 0;
    int ok_llama = fc_fsdp_config_check_model(&f, &llama, &e) == 0;
    // one class name fits exactly one model kind (corpus/fsdp_config/llama-wrap-class.json)
    check(f.n_wrap_cls != 1 || ok_mlp + ok_gpt2 + ok_llama == 1);
    if (f.n_wrap_cls == 0) check(ok_mlp && ok_gpt2 && ok_llama);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    fsdp_config(data, size);
    return 0;
}
