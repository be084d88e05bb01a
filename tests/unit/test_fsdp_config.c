// tests/unit/test_fsdp_config.c — Hugging Face fsdp_config.json reading
// (core/fsdp_config.h): every key, every value form Accelerate and
// Transformers write, every refusal (a line naming the key, the value and what
// is accepted), and `run --fsdp-config` end to end: the mapping reaches the
// trace's config, later flags override the file, earlier ones are overridden,
// and a bad file is exit 2 with one line.
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "fsdp_config.h"

static fc_fsdp_config F;
static fc_error E;

static int parse(const char *json) {
    memset(&E, 0, sizeof E);
    return fc_fsdp_config_parse(json, strlen(json), "f.json", &F, &E);
}

static void ok(const char *json) { cr_assert_eq(parse(json), 0, "%s refused: %s", json, E.msg); }

// Refused, and the one-line message holds every given fragment.
static void refused(const char *json, const char *frag1, const char *frag2, const char *frag3) {
    cr_assert_eq(parse(json), -1, "%s accepted", json);
    cr_expect_null(strchr(E.msg, '\n'), "not one line: %s", E.msg);
    cr_expect_eq(strncmp(E.msg, "f.json: ", 8), 0, "does not name the file: %s", E.msg);
    const char *frags[] = {frag1, frag2, frag3};
    for (int i = 0; i < 3; i++)
        if (frags[i]) cr_expect_not_null(strstr(E.msg, frags[i]), "'%s' not in: %s", frags[i], E.msg);
}

// ----------------------------------------------------------------------------
// accepted keys and their mapping

Test(fsdp_config, empty_object_changes_nothing) {
    ok("{}");
    fc_run_config c, d;
    fc_run_config_defaults(&c);
    d = c;
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(memcmp(&c, &d, sizeof c), 0);
    cr_expect_eq(F.state_dict, FC_FSDP_SD_UNSET);
}

Test(fsdp_config, sharding_strategy_names_and_integers) {
    static const struct { const char *v; fc_strategy s; } cases[] = {
        {"\"FULL_SHARD\"", FC_STRATEGY_FULL_SHARD},
        {"\"SHARD_GRAD_OP\"", FC_STRATEGY_SHARD_GRAD_OP},
        {"\"NO_SHARD\"", FC_STRATEGY_NO_SHARD},
        {"\"HYBRID_SHARD\"", FC_STRATEGY_HYBRID_SHARD},
        {"\"HYBRID_SHARD_ZERO2\"", FC_STRATEGY_HYBRID_SHARD_ZERO2},
        {"\"_HYBRID_SHARD_ZERO2\"", FC_STRATEGY_HYBRID_SHARD_ZERO2},
        {"\"full_shard\"", FC_STRATEGY_FULL_SHARD},
        {"1", FC_STRATEGY_FULL_SHARD},
        {"2", FC_STRATEGY_SHARD_GRAD_OP},
        {"3", FC_STRATEGY_NO_SHARD},
        {"4", FC_STRATEGY_HYBRID_SHARD},
        {"5", FC_STRATEGY_HYBRID_SHARD_ZERO2},
        {"\"1\"", FC_STRATEGY_FULL_SHARD},
        {"\"5\"", FC_STRATEGY_HYBRID_SHARD_ZERO2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"fsdp_sharding_strategy\": %s}", cases[i].v);
        ok(json);
        cr_expect(F.has_strategy);
        cr_expect_eq(F.strategy, cases[i].s, "%s", json);
        fc_run_config c;
        fc_run_config_defaults(&c);
        fc_fsdp_config_apply(&F, &c);
        cr_expect_eq(c.strategy, cases[i].s, "%s not applied", json);
    }
}

Test(fsdp_config, backward_prefetch_and_its_older_name) {
    static const struct { const char *json; fc_prefetch p; } cases[] = {
        {"{\"fsdp_backward_prefetch\": \"BACKWARD_PRE\"}", FC_PREFETCH_PRE},
        {"{\"fsdp_backward_prefetch\": \"BACKWARD_POST\"}", FC_PREFETCH_POST},
        {"{\"fsdp_backward_prefetch\": \"NO_PREFETCH\"}", FC_PREFETCH_NONE},
        {"{\"fsdp_backward_prefetch_policy\": \"BACKWARD_POST\"}", FC_PREFETCH_POST},
        {"{\"backward_prefetch\": \"backward_pre\"}", FC_PREFETCH_PRE},  // Transformers' spelling
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ok(cases[i].json);
        cr_expect(F.has_backward_prefetch);
        cr_expect_eq(F.backward_prefetch, cases[i].p, "%s", cases[i].json);
    }
}

Test(fsdp_config, booleans_in_both_forms) {
    ok("{\"fsdp_forward_prefetch\": true, \"fsdp_offload_params\": \"true\", \"fsdp_limit_all_gathers\": \"FALSE\"}");
    cr_expect(F.has_forward_prefetch && F.forward_prefetch);
    cr_expect(F.has_cpu_offload && F.cpu_offload);
    cr_expect(F.has_limit_all_gathers && !F.limit_all_gathers);
    ok("{\"forward_prefetch\": \"false\", \"offload_params\": false, \"limit_all_gathers\": true}");
    cr_expect(F.has_forward_prefetch && !F.forward_prefetch);
    cr_expect(F.has_cpu_offload && !F.cpu_offload);
    cr_expect(F.limit_all_gathers);
    fc_run_config c;
    fc_run_config_defaults(&c);
    c.forward_prefetch = 1;
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(c.forward_prefetch, 0, "an explicit false is applied");
    cr_expect_eq(c.limit_all_gathers, 1);
}

Test(fsdp_config, state_dict_type) {
    ok("{\"fsdp_state_dict_type\": \"FULL_STATE_DICT\"}");
    cr_expect_eq(F.state_dict, FC_FSDP_SD_FULL);
    ok("{\"fsdp_state_dict_type\": \"SHARDED_STATE_DICT\"}");
    cr_expect_eq(F.state_dict, FC_FSDP_SD_SHARDED);
    ok("{\"fsdp_state_dict_type\": 3}");
    cr_expect_eq(F.state_dict, FC_FSDP_SD_SHARDED);
    ok("{\"state_dict_type\": \"1\"}");
    cr_expect_eq(F.state_dict, FC_FSDP_SD_FULL);
}

Test(fsdp_config, wrap_policy_and_classes) {
    ok("{\"fsdp_auto_wrap_policy\": \"TRANSFORMER_BASED_WRAP\", \"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}");
    cr_expect_eq(F.n_wrap_cls, 1);
    cr_expect_str_eq(F.wrap_cls[0], "GPT2Block");
    ok("{\"transformer_layer_cls_to_wrap\": [\"GPT2Block\"]}");  // Transformers: a list
    cr_expect_eq(F.n_wrap_cls, 1);
    ok("{\"fsdp_transformer_layer_cls_to_wrap\": \"Linear, Linear\"}");  // Accelerate: comma-separated
    cr_expect_eq(F.n_wrap_cls, 2);
    cr_expect_str_eq(F.wrap_cls[1], "Linear");
    ok("{\"fsdp_auto_wrap_policy\": \"TRANSFORMER_BASED_WRAP\", \"fsdp_min_num_params\": 0}");
    cr_expect_eq(F.n_wrap_cls, 0);
}

Test(fsdp_config, wrap_classes_against_the_model) {
    fc_model_config gpt2, mlp;
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &gpt2, &E), 0);
    cr_assert_eq(fc_model_config_load("mlp-tiny", &mlp, &E), 0);
    ok("{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}");
    cr_expect_eq(fc_fsdp_config_check_model(&F, &gpt2, &E), 0);
    cr_expect_eq(fc_fsdp_config_check_model(&F, &mlp, &E), -1);
    cr_expect_not_null(strstr(E.msg, "\"GPT2Block\" is not a unit of model mlp-tiny"), "%s", E.msg);
    cr_expect_not_null(strstr(E.msg, "accepted \"Linear\""), "%s", E.msg);
    ok("{\"fsdp_transformer_layer_cls_to_wrap\": [\"Linear\"]}");
    cr_expect_eq(fc_fsdp_config_check_model(&F, &mlp, &E), 0);
    cr_expect_eq(fc_fsdp_config_check_model(&F, &gpt2, &E), -1, "GPT-2's lm_head is a Linear: wrapping it changes the units");
    ok("{\"fsdp_auto_wrap_policy\": \"TRANSFORMER_BASED_WRAP\"}");  // the model's own block class
    cr_expect_eq(fc_fsdp_config_check_model(&F, &mlp, &E), 0);
    cr_expect_eq(fc_fsdp_config_check_model(&F, &gpt2, &E), 0);
    // a Llama's unit is its decoder layer, and that class is no unit of GPT-2
    fc_model_config llama;
    cr_assert_eq(fc_model_config_load("llama-tiny", &llama, &E), 0);
    ok("{\"fsdp_transformer_layer_cls_to_wrap\": \"LlamaDecoderLayer\"}");
    cr_expect_eq(fc_fsdp_config_check_model(&F, &llama, &E), 0);
    cr_expect_eq(fc_fsdp_config_check_model(&F, &gpt2, &E), -1);
    cr_expect_not_null(strstr(E.msg, "not a unit of model gpt2-tiny (a gpt2: accepted \"GPT2Block\")"), "%s", E.msg);
    ok("{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}");
    cr_expect_eq(fc_fsdp_config_check_model(&F, &llama, &E), -1);
    cr_expect_not_null(strstr(E.msg, "accepted \"LlamaDecoderLayer\""), "%s", E.msg);
}

Test(fsdp_config, keys_that_leave_results_unchanged) {
    ok("{\"fsdp_use_orig_params\": true, \"fsdp_sync_module_states\": true, \"fsdp_cpu_ram_efficient_loading\": true, "
       "\"fsdp_activation_checkpointing\": false, \"fsdp_version\": 1, \"xla\": false}");
    ok("{\"fsdp_use_orig_params\": \"false\", \"fsdp_sync_module_states\": false, \"fsdp_version\": \"1\"}");
    fc_run_config c, d;
    fc_run_config_defaults(&c);
    d = c;
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(memcmp(&c, &d, sizeof c), 0);
}

// Accelerate's fsdp_activation_checkpointing and XLA's xla_fsdp_grad_ckpt both
// wrap the layer inside its FSDP unit (docs/contract.md §5); one key is an alias of the other.
Test(fsdp_config, activation_checkpointing) {
    fc_run_config c;
    const char *on[] = {"{\"fsdp_activation_checkpointing\": true}", "{\"activation_checkpointing\": \"true\"}",
                        "{\"xla_fsdp_grad_ckpt\": true}"};
    for (int i = 0; i < 3; i++) {
        ok(on[i]);
        fc_run_config_defaults(&c);
        fc_fsdp_config_apply(&F, &c);
        cr_expect_eq(c.act_ckpt, FC_ACT_CKPT_INSIDE, "%s", on[i]);
    }
    ok("{\"fsdp_activation_checkpointing\": false}");
    fc_run_config_defaults(&c);
    c.act_ckpt = FC_ACT_CKPT_OUTSIDE;  // a flag before the file is overridden by it
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(c.act_ckpt, FC_ACT_CKPT_NONE);
    refused("{\"fsdp_activation_checkpointing\": true, \"xla_fsdp_grad_ckpt\": true}", "xla_fsdp_grad_ckpt",
            "activation_checkpointing", NULL);
    refused("{\"fsdp_activation_checkpointing\": \"inside\"}", "\"inside\"", NULL, NULL);
}

Test(fsdp_config, mixed_precision) {
    ok("{\"mixed_precision\": \"bf16\"}");
    cr_expect(F.has_param_dtype);
    cr_expect_eq(F.param_dtype, FC_PREC_BF16);
    cr_expect_not(F.has_reduce_dtype, "the reduce dtype follows the param dtype, as with --param-dtype");
    ok("{\"mixed_precision\": \"fp16\"}");
    cr_expect_eq(F.param_dtype, FC_PREC_FP16);
    ok("{\"mixed_precision\": \"no\"}");
    cr_expect_eq(F.param_dtype, FC_PREC_FP32);
    ok("{\"mixed_precision_policy\": {\"param_dtype\": \"bfloat16\", \"reduce_dtype\": \"float32\", "
       "\"buffer_dtype\": \"torch.bfloat16\"}}");
    cr_expect_eq(F.param_dtype, FC_PREC_BF16);
    cr_expect(F.has_reduce_dtype);
    cr_expect_eq(F.reduce_dtype, FC_PREC_FP32);
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(c.param_dtype, FC_PREC_BF16);
    cr_expect_eq(c.reduce_dtype, FC_PREC_FP32);
    ok("{\"mixed_precision\": \"bf16\", \"fsdp_mixed_precision_policy\": {\"param_dtype\": \"bf16\"}}");
}

Test(fsdp_config, a_real_accelerate_section) {
    ok("{\"fsdp_auto_wrap_policy\": \"TRANSFORMER_BASED_WRAP\", \"fsdp_backward_prefetch\": \"BACKWARD_PRE\", "
       "\"fsdp_cpu_ram_efficient_loading\": true, \"fsdp_forward_prefetch\": false, \"fsdp_offload_params\": false, "
       "\"fsdp_sharding_strategy\": 1, \"fsdp_state_dict_type\": \"SHARDED_STATE_DICT\", "
       "\"fsdp_sync_module_states\": true, \"fsdp_use_orig_params\": true, "
       "\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\", \"mixed_precision\": \"bf16\"}");
    fc_run_config c;
    fc_run_config_defaults(&c);
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &c.model, &E), 0);
    fc_fsdp_config_apply(&F, &c);
    c.reduce_dtype = c.param_dtype;
    cr_expect_eq(c.strategy, FC_STRATEGY_FULL_SHARD);
    cr_expect_eq(c.backward_prefetch, FC_PREFETCH_PRE);
    cr_expect_eq(c.param_dtype, FC_PREC_BF16);
    cr_expect_eq(F.state_dict, FC_FSDP_SD_SHARDED);
    cr_expect_eq(fc_run_config_validate(&c, &E), 0, "%s", E.msg);
    cr_expect_eq(fc_fsdp_config_check_model(&F, &c.model, &E), 0, "%s", E.msg);
}

// ----------------------------------------------------------------------------
// every refusal: one line with the file, the key, the value and what is accepted

Test(fsdp_config, refuses_what_is_not_json_or_not_an_object) {
    refused("{\"fsdp_sharding_strategy\": ", "not valid JSON", NULL, NULL);
    refused("[1, 2]", "JSON object", NULL, NULL);
    refused("{} trailing", "not valid JSON", NULL, NULL);
    cr_assert_eq(fc_fsdp_config_parse("{}\0{", 4, "f.json", &F, &E), -1, "a NUL byte inside");
    cr_expect_not_null(strstr(E.msg, "NUL"), "%s", E.msg);
}

Test(fsdp_config, refuses_unknown_keys_naming_key_value_and_accepted_keys) {
    refused("{\"fsdp_sharding_stratgy\": \"FULL_SHARD\"}", "unknown key \"fsdp_sharding_stratgy\"",
            "(value \"FULL_SHARD\")", "sharding_strategy, backward_prefetch");
    refused("{\"fsdp_reshard_after_fwd\": true}", "\"fsdp_reshard_after_fwd\"", "(value true)", "accepted keys");
    refused("{\"distributed_type\": \"FSDP\"}", "unknown key \"distributed_type\"", NULL, NULL);
    refused("{\"fsdp_config\": {\"fsdp_sharding_strategy\": 1}}", "whole Accelerate config", NULL, NULL);
    refused("{\"bad\\nkey\": 1}", "\"bad\\u000akey\"", NULL, NULL);  // escaped: still one line
}

Test(fsdp_config, refuses_unknown_values) {
    refused("{\"fsdp_sharding_strategy\": \"ZERO3\"}", "\"fsdp_sharding_strategy\": \"ZERO3\"",
            "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or 1..5", NULL);
    refused("{\"fsdp_sharding_strategy\": 6}", "\"fsdp_sharding_strategy\": 6", "1..5", NULL);
    refused("{\"fsdp_sharding_strategy\": 0}", "\"fsdp_sharding_strategy\": 0", "1..5", NULL);
    refused("{\"fsdp_sharding_strategy\": 1.5}", "1.5", "1..5", NULL);
    refused("{\"fsdp_backward_prefetch\": \"BACKWARD_LATER\"}", "\"BACKWARD_LATER\"",
            "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH", NULL);
    refused("{\"fsdp_backward_prefetch\": 1}", "\"fsdp_backward_prefetch\": 1", "BACKWARD_PRE", NULL);
    refused("{\"fsdp_forward_prefetch\": \"yes\"}", "\"fsdp_forward_prefetch\": \"yes\"", "true, false", NULL);
    refused("{\"fsdp_offload_params\": 1}", "\"fsdp_offload_params\": 1", "boolean", NULL);
    refused("{\"fsdp_limit_all_gathers\": null}", "\"fsdp_limit_all_gathers\": null", "boolean", NULL);
    refused("{\"fsdp_state_dict_type\": \"FULL\"}", "\"FULL\"", "FULL_STATE_DICT or SHARDED_STATE_DICT", NULL);
    refused("{\"fsdp_auto_wrap_policy\": \"LAYER_WRAP\"}", "\"LAYER_WRAP\"", "TRANSFORMER_BASED_WRAP", NULL);
    refused("{\"fsdp_transformer_layer_cls_to_wrap\": \"MistralDecoderLayer\"}", "\"MistralDecoderLayer\"",
            "GPT2Block for gpt2, LlamaDecoderLayer for llama, Linear for mlp", NULL);
    refused("{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block,\"}", "empty class name", NULL, NULL);
    refused("{\"fsdp_transformer_layer_cls_to_wrap\": []}", "[]", "GPT2Block", NULL);
    refused("{\"fsdp_transformer_layer_cls_to_wrap\": [1]}", "list of strings", NULL, NULL);
    refused("{\"fsdp_min_num_params\": -1}", "-1", "non-negative", NULL);
    refused("{\"fsdp_use_orig_params\": \"maybe\"}", "\"maybe\"", "boolean", NULL);
    refused("{\"fsdp_sync_module_states\": 0}", "\"fsdp_sync_module_states\": 0", "boolean", NULL);
    refused("{\"fsdp_version\": 3}", "\"fsdp_version\": 3", "accepted: 1, 2", NULL);
    refused("{\"fsdp_version\": 2, \"fsdp_reshard_after_forward\": \"no\"}", "\"fsdp_reshard_after_forward\"",
            "boolean", NULL);
    refused("{\"mixed_precision\": \"int8\"}", "\"mixed_precision\": \"int8\"", "no, fp32, bf16, fp16", NULL);
    refused("{\"mixed_precision_policy\": \"bf16\"}", "param_dtype, reduce_dtype, buffer_dtype", NULL, NULL);
    refused("{\"mixed_precision_policy\": {\"param_dtype\": \"int8\"}}", "\"mixed_precision_policy.param_dtype\": \"int8\"",
            "float32, bfloat16, float16", NULL);
    refused("{\"mixed_precision_policy\": {\"cast_forward_inputs\": true}}", "cast_forward_inputs",
            "param_dtype, reduce_dtype, buffer_dtype", NULL);
}

Test(fsdp_config, refuses_values_that_would_change_results_with_a_reason) {
    refused("{\"fsdp_state_dict_type\": \"LOCAL_STATE_DICT\"}", "LOCAL_STATE_DICT", "FULL_STATE_DICT or SHARDED_STATE_DICT", NULL);
    refused("{\"fsdp_state_dict_type\": 2}", "\"fsdp_state_dict_type\": 2", "not supported", NULL);
    refused("{\"fsdp_auto_wrap_policy\": \"SIZE_BASED_WRAP\"}", "SIZE_BASED_WRAP", "parameter count", "TRANSFORMER_BASED_WRAP");
    refused("{\"fsdp_auto_wrap_policy\": \"NO_WRAP\"}", "NO_WRAP", "one unit", NULL);
    refused("{\"fsdp_min_num_params\": 100000000}", "100000000", "wraps by size", NULL);
    refused("{\"fsdp_version\": 2, \"fsdp_reshard_after_forward\": 1}", "not a group size", "R >= 2", NULL);
    refused("{\"xla\": true}", "XLA", "accepted: false", NULL);
    refused("{\"mixed_precision\": \"fp8\"}", "fp8", "not modelled", NULL);
    refused("{\"fsdp_cpu_ram_efficient_loading\": true, \"fsdp_sync_module_states\": false}",
            "\"fsdp_cpu_ram_efficient_loading\": true needs \"fsdp_sync_module_states\": true", NULL, NULL);
    refused("{\"mixed_precision\": \"bf16\", \"mixed_precision_policy\": {\"param_dtype\": \"float16\"}}", "disagree",
            NULL, NULL);
}

// Accelerate's FSDP2 config (issue 25's): version 2, reshard_after_forward
// for the strategy; FSDP1's keys refused with version 2, FSDP2's without it.
Test(fsdp_config, version_2) {
    ok("{\"fsdp_version\": 2, \"fsdp_auto_wrap_policy\": \"TRANSFORMER_BASED_WRAP\", "
       "\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\", \"fsdp_reshard_after_forward\": true, "
       "\"fsdp_state_dict_type\": \"SHARDED_STATE_DICT\"}");
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(c.fsdp_version, 2);
    cr_expect_eq(c.strategy, FC_STRATEGY_FULL_SHARD);
    cr_expect_eq(c.reshard_after_forward, 0);
    ok("{\"version\": \"2\", \"reshard_after_forward\": false, \"cpu_ram_efficient_loading\": true}");
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(c.strategy, FC_STRATEGY_SHARD_GRAD_OP);
    // an integer R: FULL_SHARD keeping a 1/R slice after forward
    ok("{\"fsdp_version\": 2, \"fsdp_reshard_after_forward\": 2}");
    fc_fsdp_config_apply(&F, &c);
    cr_expect_eq(c.strategy, FC_STRATEGY_FULL_SHARD);
    cr_expect_eq(c.reshard_after_forward, 2);
    fc_error e;
    cr_expect_eq(fc_run_config_validate(&c, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_run_config_validate_world(&c, 4, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_run_config_validate_world(&c, 2, &e), -1, "R = F is reshard_after_forward=True");
    cr_expect(strstr(e.msg, "must divide the shard group") != NULL, "%s", e.msg);
    c.global_batch = 12;
    cr_expect_eq(fc_run_config_validate_world(&c, 6, &e), 0, "%s", e.msg);
    c.reshard_after_forward = 4;
    cr_expect_eq(fc_run_config_validate_world(&c, 6, &e), -1, "4 does not divide 6");
    const char *fsdp1[] = {"\"fsdp_sharding_strategy\": \"FULL_SHARD\"", "\"fsdp_backward_prefetch\": \"BACKWARD_PRE\"",
                           "\"fsdp_forward_prefetch\": false", "\"fsdp_limit_all_gathers\": true",
                           "\"fsdp_use_orig_params\": true", "\"fsdp_sync_module_states\": true"};
    for (size_t i = 0; i < sizeof fsdp1 / sizeof fsdp1[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{%s, \"fsdp_version\": 2}", fsdp1[i]);
        refused(json, "is an FSDP1 key", "\"fsdp_version\": 2", NULL);
    }
    refused("{\"fsdp_reshard_after_forward\": true}", "is an FSDP2 key", "fsdp_version", NULL);
    refused("{\"fsdp_version\": 1, \"fsdp_reshard_after_forward\": true}", "is an FSDP2 key", NULL, NULL);
}

Test(fsdp_config, refuses_the_same_setting_twice) {
    refused("{\"fsdp_forward_prefetch\": true, \"forward_prefetch\": false}", "\"fsdp_forward_prefetch\" and "
            "\"forward_prefetch\" set the same thing", NULL, NULL);
    refused("{\"fsdp_backward_prefetch\": \"BACKWARD_PRE\", \"fsdp_backward_prefetch_policy\": \"BACKWARD_PRE\"}",
            "set the same thing", NULL, NULL);
    refused("{\"fsdp_version\": 1, \"fsdp_version\": 1}", "set the same thing", NULL, NULL);
}

Test(fsdp_config, load_refuses_missing_and_oversized_files) {
    cr_expect_eq(fc_fsdp_config_load("/nonexistent/fsdp_config.json", &F, &E), -1);
    cr_expect_not_null(strstr(E.msg, "--fsdp-config /nonexistent/fsdp_config.json: cannot open"), "%s", E.msg);
    char path[] = "/tmp/fc_fsdp_big_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputc('{', f);
    for (int i = 0; i < (1 << 20); i++) fputc(' ', f);
    fputc('}', f);
    fclose(f);
    cr_expect_eq(fc_fsdp_config_load(path, &F, &E), -1);
    cr_expect_not_null(strstr(E.msg, "larger than"), "%s", E.msg);
    unlink(path);
}

// ----------------------------------------------------------------------------
// `fsdpcheck run --fsdp-config` end to end

static const char *binary(void) {
    const char *b = getenv("FC_FSDPCHECK_BIN");
    return b && *b ? b : FC_FSDPCHECK_BIN;
}

static char g_dir[256];

static void cli_setup(void) {
    // MPI singleton init under ASan: hwloc's PCI discovery leaks (LeakSanitizer
    // would fail the child); the MPI tests set the same in ctest
    setenv("HWLOC_COMPONENTS", "-pci,-x86", 1);
    snprintf(g_dir, sizeof g_dir, "/tmp/fc_test_fsdp_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void cli_teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", g_dir);
}

// Runs fsdpcheck with args; stdout and stderr go to files in g_dir; returns the exit code.
static int run_cli(const char *const *args, char *err, size_t err_cap) {
    char out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/stdout", g_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", g_dir);
    const char *argv[32];
    int n = 0;
    argv[n++] = binary();
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY), o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644),
            r = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || o < 0 || r < 0 || dup2(in, 0) < 0 || dup2(o, 1) < 0 || dup2(r, 2) < 0) _exit(126);
        alarm(60);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) cr_assert_eq(errno, EINTR);
    FILE *f = fopen(err_path, "r");
    size_t k = f ? fread(err, 1, err_cap - 1, f) : 0;
    err[k] = '\0';
    if (f) fclose(f);
    cr_assert(WIFEXITED(status), "fsdpcheck killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return WEXITSTATUS(status);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const char *write_json(const char *name, const char *text) {
    static char path[8][300];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 300, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    return p;
}

// The run config a trace recorded.
static cJSON *trace_config(const char *trace_dir, cJSON **root) {
    char path[400];
    snprintf(path, sizeof path, "%s/trace.json", trace_dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no %s", path);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    *root = cJSON_Parse(buf);
    cr_assert_not_null(*root);
    return cJSON_GetObjectItem(*root, "config");
}

static const char *cfg_str(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(cfg, key);
    cr_assert(cJSON_IsString(v), "no %s", key);
    return v->valuestring;
}

TestSuite(fsdp_cli, .init = cli_setup, .fini = cli_teardown, .timeout = 120);

Test(fsdp_cli, the_file_reaches_the_run) {
    const char *f = write_json("fsdp.json",
                               "{\"fsdp_sharding_strategy\": \"SHARD_GRAD_OP\", \"fsdp_backward_prefetch\": "
                               "\"BACKWARD_POST\", \"fsdp_forward_prefetch\": \"true\", "
                               "\"fsdp_transformer_layer_cls_to_wrap\": \"Linear\"}");
    char err[4096], trace[300];
    snprintf(trace, sizeof trace, "%s/t", g_dir);
    int rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--trace", trace), err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *root;
    const cJSON *cfg = trace_config(trace, &root);
    cr_expect_str_eq(cfg_str(cfg, "strategy"), "shard_grad_op");
    cr_expect_str_eq(cfg_str(cfg, "backward_prefetch"), "post");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "forward_prefetch")));
    cJSON_Delete(root);
}

// Accelerate's key puts the checkpoint inside the unit, and so does Hugging
// Face's --gradient-checkpointing (given after a file that turns it off);
// --activation-checkpointing outside after the file overrides it.
Test(fsdp_cli, activation_checkpointing_reaches_the_run) {
    const char *f = write_json("fsdp.json", "{\"fsdp_sharding_strategy\": \"FULL_SHARD\", "
                                            "\"fsdp_activation_checkpointing\": true}");
    const char *off = write_json("fsdp_off.json", "{\"fsdp_sharding_strategy\": \"FULL_SHARD\", "
                                                  "\"fsdp_activation_checkpointing\": false}");
    char err[4096], t1[300], t2[300], t3[300];
    snprintf(t1, sizeof t1, "%s/inside", g_dir);
    snprintf(t2, sizeof t2, "%s/hf", g_dir);
    snprintf(t3, sizeof t3, "%s/outside", g_dir);
    int rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--trace", t1), err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", off, "--gradient-checkpointing", "--trace",
                      t2),
                 err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--activation-checkpointing", "outside",
                      "--trace", t3),
                 err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *r1, *r2, *r3;
    cr_expect_str_eq(cfg_str(trace_config(t1, &r1), "activation_checkpointing"), "inside");
    cr_expect_str_eq(cfg_str(trace_config(t2, &r2), "activation_checkpointing"), "inside");
    cr_expect_str_eq(cfg_str(trace_config(t3, &r3), "activation_checkpointing"), "outside");
    cJSON_Delete(r1);
    cJSON_Delete(r2);
    cJSON_Delete(r3);
}

Test(fsdp_cli, flags_after_the_file_override_it_flags_before_are_overridden) {
    const char *f = write_json("fsdp.json", "{\"fsdp_sharding_strategy\": 1, \"fsdp_backward_prefetch\": \"BACKWARD_PRE\"}");
    char err[4096], t1[300], t2[300];
    snprintf(t1, sizeof t1, "%s/after", g_dir);
    snprintf(t2, sizeof t2, "%s/before", g_dir);
    int rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--backward-prefetch", "post",
                          "--trace", t1),
                     err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--backward-prefetch", "post", "--strategy", "full_shard",
                      "--fsdp-config", f, "--trace", t2),
                 err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    cJSON *r1, *r2;
    cr_expect_str_eq(cfg_str(trace_config(t1, &r1), "backward_prefetch"), "post", "the flag after the file wins");
    cr_expect_str_eq(cfg_str(trace_config(t2, &r2), "backward_prefetch"), "pre", "the file after the flag wins");
    cJSON_Delete(r1);
    cJSON_Delete(r2);
}

Test(fsdp_cli, mixed_precision_follows_param_dtype_rules) {
    const char *f = write_json("fsdp.json", "{\"fsdp_sharding_strategy\": \"FULL_SHARD\", \"mixed_precision\": \"bf16\"}");
    const char *g = write_json("fsdp2.json", "{\"fsdp_sharding_strategy\": \"FULL_SHARD\", \"mixed_precision_policy\": "
                                             "{\"param_dtype\": \"bfloat16\", \"reduce_dtype\": \"float32\"}}");
    char err[4096], t1[300], t2[300];
    snprintf(t1, sizeof t1, "%s/a", g_dir);
    snprintf(t2, sizeof t2, "%s/b", g_dir);
    cr_assert_eq(run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--trace", t1), err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", g, "--trace", t2), err, sizeof err), 0,
                 "%s", err);
    cJSON *r1, *r2;
    const cJSON *c1 = trace_config(t1, &r1), *c2 = trace_config(t2, &r2);
    cr_expect_str_eq(cfg_str(c1, "param_dtype"), "bf16");
    cr_expect_str_eq(cfg_str(c1, "reduce_dtype"), "bf16", "the reduce dtype follows");
    cr_expect_str_eq(cfg_str(c2, "param_dtype"), "bf16");
    cr_expect_str_eq(cfg_str(c2, "reduce_dtype"), "fp32", "an explicit reduce dtype is kept");
    cJSON_Delete(r1);
    cJSON_Delete(r2);
}

static void expect_usage(const char *const *args, const char *frag1, const char *frag2) {
    char err[4096];
    int rc = run_cli(args, err, sizeof err);
    cr_expect_eq(rc, 2, "exit %d, want 2: %s", rc, err);
    size_t len = strlen(err);
    cr_expect(len > 0 && err[len - 1] == '\n' && strchr(err, '\n') == err + len - 1, "not one line: %s", err);
    cr_expect_eq(strncmp(err, "fsdpcheck: ", 11), 0, "%s", err);
    cr_expect_not_null(strstr(err, frag1), "'%s' not in: %s", frag1, err);
    if (frag2) cr_expect_not_null(strstr(err, frag2), "'%s' not in: %s", frag2, err);
}

Test(fsdp_cli, bad_files_are_usage_errors) {
    const char *bad = write_json("bad.json", "{\"fsdp_sharding_strategy\": \"ZERO3\"}");
    expect_usage(ARGS("run", "--quiet", "--fsdp-config", bad), "\"ZERO3\"", "FULL_SHARD");
    const char *wrong = write_json("wrong.json", "{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}");
    expect_usage(ARGS("run", "--quiet", "--fsdp-config", wrong), "not a unit of model mlp-tiny", NULL);
    // the model chosen after the file is the one checked
    const char *ok_gpt2 = write_json("gpt2.json", "{\"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\"}");
    expect_usage(ARGS("run", "--quiet", "--fsdp-config", ok_gpt2, "--model", "mlp-tiny"), "GPT2Block", NULL);
    expect_usage(ARGS("run", "--quiet", "--fsdp-config", "/nonexistent.json"), "cannot open", NULL);
    expect_usage(ARGS("run", "--quiet", "--fsdp-config", ok_gpt2, "--fsdp-config", ok_gpt2), "given twice", NULL);
    // a file whose settings contradict the strategy meets the same validation as flags
    const char *noop = write_json("noop.json", "{\"fsdp_sharding_strategy\": \"NO_SHARD\", \"fsdp_backward_prefetch\": "
                                               "\"BACKWARD_PRE\"}");
    expect_usage(ARGS("run", "--quiet", "--fsdp-config", noop), "sharded strategy", NULL);
}

Test(fsdp_cli, state_dict_type_is_the_default_of_state_dict) {
    // --save with the file's SHARDED_STATE_DICT writes shard files; --state-dict after it overrides
    const char *f = write_json("fsdp.json", "{\"fsdp_state_dict_type\": \"SHARDED_STATE_DICT\"}");
    char err[4096], ck1[300], ck2[300], probe[400];
    snprintf(ck1, sizeof ck1, "%s/ck1", g_dir);
    snprintf(ck2, sizeof ck2, "%s/ck2", g_dir);
    int rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--save", ck1), err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    snprintf(probe, sizeof probe, "%s/model.safetensors", ck1);
    cr_expect_neq(access(probe, F_OK), 0, "a sharded checkpoint has no model.safetensors");
    snprintf(probe, sizeof probe, "%s/shard-00000.safetensors", ck1);
    cr_expect_eq(access(probe, F_OK), 0, "no %s", probe);
    rc = run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f, "--save", ck2, "--state-dict", "full"), err,
                 sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    snprintf(probe, sizeof probe, "%s/model.safetensors", ck2);
    cr_expect_eq(access(probe, F_OK), 0, "--state-dict full after the file: no %s", probe);
    // without --save the state dict type changes nothing, and is accepted
    cr_expect_eq(run_cli(ARGS("run", "--quiet", "--steps", "1", "--fsdp-config", f), err, sizeof err), 0, "%s", err);
}
