// core/fsdp_config.h — a Hugging Face Accelerate / Transformers fsdp_config.json
// (`fsdpcheck run --fsdp-config FILE`), mapped onto fc_run_config.
//
// The file is the `fsdp_config` section of an Accelerate config (keys with the
// "fsdp_" prefix) or a Transformers TrainingArguments fsdp_config (the same
// keys with or without the prefix: Transformers strips it), plus the
// Accelerate top-level "mixed_precision". Every key must be known and every
// value valid: a key fsdpcheck does not model is refused, never ignored, with
// one line naming the key, its value and what is accepted.
//
//   key (fsdp_ prefix optional)        value                          maps to
//   sharding_strategy                  FULL_SHARD, SHARD_GRAD_OP,     --strategy
//                                      NO_SHARD, HYBRID_SHARD,
//                                      HYBRID_SHARD_ZERO2 or 1..5
//   backward_prefetch (or the older    BACKWARD_PRE, BACKWARD_POST,   --backward-prefetch
//     backward_prefetch_policy)        NO_PREFETCH
//   forward_prefetch                   bool                           --forward-prefetch
//   offload_params                     bool                           --cpu-offload
//   limit_all_gathers                  bool                           --limit-all-gathers
//   state_dict_type                    FULL_STATE_DICT,               --state-dict's default
//                                      SHARDED_STATE_DICT (or 1, 3)
//   auto_wrap_policy                   TRANSFORMER_BASED_WRAP         (fsdpcheck's units)
//   transformer_layer_cls_to_wrap      GPT2Block (gpt2) / Linear (mlp)
//   min_num_params                     0
//   use_orig_params, sync_module_states  bool (no effect on results)
//   cpu_ram_efficient_loading          bool (true needs sync_module_states)
//   activation_checkpointing           false
//   version                            1, 2                           --fsdp-version
//   reshard_after_forward (version 2)  bool: FULL_SHARD, SHARD_GRAD_OP --strategy
//   With version 2, FSDP1's keys (sharding_strategy, backward_prefetch,
//   forward_prefetch, limit_all_gathers, use_orig_params,
//   sync_module_states) are refused.
//   xla                                false
//   mixed_precision                    no, fp32, bf16, fp16            --param-dtype
//   mixed_precision_policy             {param_dtype, reduce_dtype,     --param-dtype,
//                                        buffer_dtype}                  --reduce-dtype
//
// Booleans are JSON booleans or the strings "true"/"false"; names are matched
// case-insensitively, integers may be JSON numbers or digit strings, as
// Accelerate reads them.
#ifndef FC_FSDP_CONFIG_H
#define FC_FSDP_CONFIG_H

#include <stddef.h>

#include "check.h"
#include "config.h"
#include "hd.h"

FC_BEGIN_DECLS

typedef enum { FC_FSDP_SD_UNSET, FC_FSDP_SD_FULL, FC_FSDP_SD_SHARDED } fc_fsdp_state_dict;

#define FC_FSDP_MAX_WRAP_CLS 8

// What a file set: only keys present in the file are applied, each has_* says so.
typedef struct {
    char path[1024];
    int has_strategy;
    fc_strategy strategy;
    int has_version, version;    // fsdp_version: 1 or 2
    int has_reshard_after_forward, reshard_after_forward;  // version 2: FULL_SHARD or SHARD_GRAD_OP
    int reshard_after_forward_r;  // version 2: an integer R (FULL_SHARD with a 1/R slice kept), 0 if none
    int has_backward_prefetch;
    fc_prefetch backward_prefetch;
    int has_forward_prefetch, forward_prefetch;
    int has_cpu_offload, cpu_offload;
    int has_act_ckpt;            // activation_checkpointing / xla_fsdp_grad_ckpt: true is inside the unit
    fc_act_ckpt act_ckpt;
    int has_limit_all_gathers, limit_all_gathers;
    int has_param_dtype;
    fc_prec param_dtype;
    int has_reduce_dtype;        // an explicit reduce dtype (mixed_precision_policy)
    fc_prec reduce_dtype;
    fc_fsdp_state_dict state_dict;
    // transformer_layer_cls_to_wrap, checked against the final model by
    // fc_fsdp_config_check_model (the model may be chosen after the file)
    int n_wrap_cls;
    char wrap_cls[FC_FSDP_MAX_WRAP_CLS][64];
} fc_fsdp_config;

// Reads and validates a file (at most 1 MiB).
int fc_fsdp_config_load(const char *path, fc_fsdp_config *out, fc_error *e);
// The same for text in memory (len bytes, need not be NUL-terminated); path
// is only used in messages.
int fc_fsdp_config_parse(const char *text, size_t len, const char *path, fc_fsdp_config *out, fc_error *e);
// Sets in c every field the file gave.
void fc_fsdp_config_apply(const fc_fsdp_config *f, fc_run_config *c);
// Checks transformer_layer_cls_to_wrap against the model's unit structure.
int fc_fsdp_config_check_model(const fc_fsdp_config *f, const fc_model_config *m, fc_error *e);

FC_END_DECLS

#endif
