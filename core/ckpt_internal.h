// core/ckpt_internal.h — what the checkpoint's files (ckpt_manifest.c,
// ckpt_read.c, ckpt_verify.c, ckpt_pieces.c, ckpt_write.c) share and nothing
// outside them uses: the file names of a checkpoint, and the JSON and message
// helpers of the manifest parser that the shard layout parser reuses.
#ifndef FC_CKPT_INTERNAL_H
#define FC_CKPT_INTERNAL_H

#include <cJSON.h>
#include <stdint.h>

#include "check.h"
#include "model.h"

#define FC_CKPT_CONFIG "config.json"
#define FC_CKPT_MODEL "model.safetensors"
#define FC_CKPT_OPTIM "optimizer.safetensors"
#define FC_CKPT_MAX_MANIFEST (16u << 20)  // a manifest of 65536 shard files is ~8 MiB
#define FC_CKPT_JSON_MAX_INT 9007199254740992.0  // 2^53: every integer below is exact in a double

// "shard-RRRRR.safetensors" -> R (five or more digits), -1 otherwise.
long fc_ckpt_shard_index(const char *s);

// "shard-SSSSS-model-IIIII-of-NNNNN.safetensors" (torch's
// HuggingFaceStorageWriter, save_distributed) -> S (>= 1), -1 otherwise.
long fc_ckpt_dcp_index(const char *s);

// obj[key] as a non-negative integer no larger than max: 0, or -1 if it is not one.
int fc_ckpt_json_uint(const cJSON *obj, const char *key, double max, uint64_t *out);
// obj[key] if it is a string, else NULL.
const char *fc_ckpt_json_str(const cJSON *obj, const char *key);

// A cJSON builder's result: NULL (out of memory) dies with file:line, as
// mallocCheck does (check.h).
void fc_ckpt_json_check(const void *p, const char *file, int line);
#define jsonCheck(p) fc_ckpt_json_check((const void *)(p), __FILE__, __LINE__)

// PEFT's files beside a LoRA model's FULL checkpoint (ckpt_peft.c):
// adapter_model.safetensors and adapter_config.json, as
// PeftModel.save_pretrained writes them.
#define FC_CKPT_PEFT_MODEL "adapter_model.safetensors"
#define FC_CKPT_PEFT_CONFIG "adapter_config.json"
// How many of them a FULL checkpoint of m holds: 2 for a LoRA model, else 0.
int fc_ckpt_peft_files(const fc_model *m);
// The name PEFT saves a LoRA parameter under ("model.layers.0.self_attn.
// q_proj.lora_A.default.weight" -> "base_model.model.model.layers.0.
// self_attn.q_proj.lora_A.weight"); -1 for a name that is not an adapter's.
int fc_ckpt_peft_name(const char *name, char *out, size_t cap);
// m's LoraConfig as adapter_config.json holds it (the caller deletes it).
cJSON *fc_ckpt_peft_config_json(const fc_model *m);

// A value from a file printed into a message: at most 60 bytes and "...",
// control bytes as '?'.
typedef struct {
    char s[72];
} fc_ckpt_shown;
fc_ckpt_shown fc_ckpt_show(const char *str);
// Makes e's message one line (control bytes become '?'); returns -1.
int fc_ckpt_one_line(fc_error *e);

#endif
