// core/ckpt_peft.c — what PEFT writes for a LoRA model, beside FSDP's FULL
// checkpoint (docs/contract.md §6; docs/contract.md "LoRA"). A Trainer or
// accelerate run of a PeftModel saves its adapters with
// PeftModel.save_pretrained: adapter_model.safetensors holds lora_A and lora_B
// of every adapted linear under "base_model.model." + the parameter's name
// without the adapter's name ("…q_proj.lora_A.default.weight" is saved as
// "base_model.model.…q_proj.lora_A.weight"), with __metadata__ {"format": "pt"};
// adapter_config.json is its LoraConfig. Measured with peft 0.21.2 on a llama:
// those names, and target_modules as the list of module paths it was given.
// PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(DIR), DIR) then
// loads a FULL checkpoint of the reference (the adapter's tests/test_lora.py).
#include <stdio.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_internal.h"

int fc_ckpt_peft_files(const fc_model *m) { return m->cfg.lora_r > 0 ? 2 : 0; }
int fc_ckpt_full_files(const fc_model *m) { return 2 + fc_ckpt_peft_files(m); }

int fc_ckpt_peft_name(const char *name, char *out, size_t cap) {
    static const char adapter[] = ".default.weight";
    size_t n = strlen(name), k = sizeof adapter - 1;
    if (n <= k || strcmp(name + n - k, adapter) != 0) return -1;
    int w = snprintf(out, cap, "base_model.model.%.*s.weight", (int)(n - k), name);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

cJSON *fc_ckpt_peft_config_json(const fc_model *m) {
    cJSON *j = cJSON_CreateObject();
    jsonCheck(j);
    jsonCheck(cJSON_AddStringToObject(j, "peft_type", "LORA"));
    jsonCheck(cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM"));
    jsonCheck(cJSON_AddNumberToObject(j, "r", m->cfg.lora_r));
    jsonCheck(cJSON_AddNumberToObject(j, "lora_alpha", m->cfg.lora_alpha));
    jsonCheck(cJSON_AddNumberToObject(j, "lora_dropout", 0.0));
    jsonCheck(cJSON_AddStringToObject(j, "bias", "none"));
    // the module paths adapted, in registration order: the base weight's name without ".weight"
    cJSON *t = cJSON_AddArrayToObject(j, "target_modules");
    jsonCheck(t);
    for (int i = 0; i < m->n_params; i++) {
        if (m->lora[i] < 0) continue;
        char path[sizeof m->params[i].name];
        size_t n = strlen(m->params[i].name) - strlen(".weight");
        snprintf(path, sizeof path, "%.*s", (int)n, m->params[i].name);
        cJSON *s = cJSON_CreateString(path);
        jsonCheck(s);
        cJSON_AddItemToArray(t, s);
    }
    // what the reference's adapters are and are not (PEFT's defaults, written
    // out so that a reader with other defaults builds the same adapters)
    jsonCheck(cJSON_AddFalseToObject(j, "fan_in_fan_out"));
    jsonCheck(cJSON_AddFalseToObject(j, "use_rslora"));
    jsonCheck(cJSON_AddFalseToObject(j, "use_dora"));
    jsonCheck(cJSON_AddTrueToObject(j, "init_lora_weights"));
    jsonCheck(cJSON_AddTrueToObject(j, "inference_mode"));
    jsonCheck(cJSON_AddNullToObject(j, "base_model_name_or_path"));
    jsonCheck(cJSON_AddNullToObject(j, "modules_to_save"));
    return j;
}
