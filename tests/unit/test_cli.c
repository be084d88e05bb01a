// tests/unit/test_cli.c — the fsdpcheck command line, run as a user runs it.
//
// Every test spawns the real binary (FC_FSDPCHECK_BIN; the environment variable
// of the same name overrides it) with fork + execv, stdin from /dev/null,
// stdout and stderr captured separately through pipes, and a kill after a
// timeout. Nothing here links the CLI's own code: the tests see only the exit
// status, the two output streams and the files left on disk.
//
// Contracts checked (docs/contract.md §6-§7):
//  - misuse: exit 2, nothing on stdout, exactly one line on stderr that starts
//    with "fsdpcheck: " and names the problem (a distinctive substring of it),
//    and nothing written: each misuse runs in an empty working directory with
//    --trace pointing into it, and both must stay empty;
//  - run --trace DIR: exactly trace.json, init.safetensors and one
//    step-NNNNNN.safetensors per step, each parsed and checked against the
//    model registry (core/model.h), no temporaries left;
//  - P12: the same run twice is byte-identical; --init of a run's own
//    init.safetensors reproduces that run byte for byte.
//
// Fixture files (safetensors, config.json) are written by hand here, in a
// mkdtemp directory, with a writer that shares no code with core/safetensors.c.
#include <criterion/criterion.h>

#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "model.h"
#include "safetensors.h"

#define RUN_TIMEOUT_S 30
#include "cli_harness.h"

// ----------------------------------------------------------------------------
// one temporary directory per test

static void setup(void) { tmp_setup("fc_test_cli"); }

TestSuite(cli, .init = setup, .fini = tmp_teardown, .timeout = 120);

// ----------------------------------------------------------------------------
// the misuse contract

// exit 2, nothing on stdout, exactly one "fsdpcheck: ..." line on stderr
// that contains `what` (the flag, value or file at fault; may be NULL) and
// `why` (a word of the reason, which is never part of the command line, so
// a program that merely echoed its arguments would not pass).
static void expect_usage_error2(const result *r, const char *what, const char *why) {
    cr_expect_eq(r->code, 2, "%s: exit %d (signal %d), want 2; stderr:\n%s", r->cmd, r->code, r->signal,
                 r->err);
    cr_expect_eq(r->out_len, 0, "%s: printed on stdout:\n%s", r->cmd, r->out);
    int lines = count_lines(r->err, r->err_len);
    cr_expect(lines == 1 && r->err_len > 0 && r->err[r->err_len - 1] == '\n',
              "%s: stderr must be exactly one line, got %d:\n%s", r->cmd, lines, r->err);
    cr_expect(strncmp(r->err, "fsdpcheck: ", 11) == 0, "%s: stderr does not start with 'fsdpcheck: ':\n%s",
              r->cmd, r->err);
    if (what)
        cr_expect_not_null(strstr(r->err, what), "%s: stderr does not name '%s':\n%s", r->cmd, what, r->err);
    cr_expect_not_null(strstr(r->err, why), "%s: stderr does not say '%s':\n%s", r->cmd, why, r->err);
}

// Runs `fsdpcheck <args>` in an empty working directory. When args[0] is
// "run", "--trace <work>/trace" is put right after it, so a misuse that gets
// as far as writing a trace would show. Then checks the misuse contract and
// that the working directory is still empty.
static void misuse(const char *what, const char *why, const char *const *args) {
    const char *work = tmp_path("work");
    make_dir(work);
    const char *full[64];
    int n = 0, k = 0;
    if (args[0] && !strcmp(args[0], "run")) {
        full[n++] = args[k++];
        full[n++] = "--trace";
        full[n++] = tmp_path("work/trace");
    }
    while (args[k]) {
        cr_assert_lt(n, 62);
        full[n++] = args[k++];
    }
    full[n] = NULL;
    result r;
    run_in(work, full, &r);
    expect_usage_error2(&r, what, why);
    expect_listing(work, "");
    result_free(&r);
}

#define MISUSE(what, why, ...) misuse((what), (why), ARGS(__VA_ARGS__))

// ----------------------------------------------------------------------------
// a safetensors writer of our own (not core's), for --init fixtures

typedef struct {
    const char *name;
    const char *dtype;  // "F32", "I32", ...
    int ndim;
    uint64_t shape[2];
    const void *data;   // numel * 4 bytes
} st_tensor;

static void write_safetensors(const char *path, const st_tensor *t, int n) {
    char header[16384];
    size_t h = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        h += (size_t)snprintf(header + h, sizeof header - h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                              t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            h += (size_t)snprintf(header + h, sizeof header - h, "%s%llu", d ? "," : "",
                                  (unsigned long long)t[i].shape[d]);
        h += (size_t)snprintf(header + h, sizeof header - h, "],\"data_offsets\":[%llu,%llu]}",
                              (unsigned long long)off, (unsigned long long)(off + numel * 4));
        off += numel * 4;
    }
    h += (size_t)snprintf(header + h, sizeof header - h, "}");
    while (h % 8) header[h++] = ' ';
    cr_assert_lt(h, sizeof header - 8);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, h, f);
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        fwrite(t[i].data, 4, numel, f);  // the test machines are little-endian
    }
    cr_assert_eq(fclose(f), 0);
}

typedef enum { FIX_GOOD, FIX_MISSING, FIX_WRONG_SHAPE, FIX_WRONG_DTYPE, FIX_EXTRA } fixture_kind;

// An mlp-tiny weight file, correct or with one defect. Returns the name of
// the parameter the defect concerns.
static const char *write_mlp_init(const char *path, fixture_kind kind) {
    fc_model_config cfg;
    fc_error e;
    cr_assert_eq(fc_model_config_load("mlp-tiny", &cfg, &e), 0, "%s", e.msg);
    fc_model m;
    fc_model_build(&m, &cfg);
    cr_assert_lt(m.n_params, 30);
    static float data[4096];
    for (size_t i = 0; i < sizeof data / sizeof data[0]; i++) data[i] = 0.01f * (float)((i * 7) % 23) - 0.1f;
    st_tensor t[32];
    int n = 0;
    static char victim[96];
    for (int i = 0; i < m.n_params; i++) {
        const fc_param *p = &m.params[i];
        cr_assert_leq(p->numel, 4096);
        st_tensor x = {p->name, "F32", p->ndim, {(uint64_t)p->shape[0], (uint64_t)p->shape[1]}, data};
        if (i == m.n_params - 1 && kind == FIX_MISSING) {
            snprintf(victim, sizeof victim, "%s", p->name);
            continue;
        }
        if (i == 0 && kind == FIX_WRONG_SHAPE) {
            // same element count, transposed: only a shape check catches it
            cr_assert_eq(p->ndim, 2);
            x.shape[0] = (uint64_t)p->shape[1];
            x.shape[1] = (uint64_t)p->shape[0];
            snprintf(victim, sizeof victim, "%s", p->name);
        }
        if (i == 0 && kind == FIX_WRONG_DTYPE) {
            x.dtype = "I32";
            snprintf(victim, sizeof victim, "%s", p->name);
        }
        t[n++] = x;
    }
    if (kind == FIX_EXTRA) {
        snprintf(victim, sizeof victim, "layers.9.weight");
        t[n++] = (st_tensor){victim, "F32", 1, {4, 0}, data};
    }
    write_safetensors(path, t, n);
    fc_model_free(&m);
    return victim;
}

// ----------------------------------------------------------------------------
// 1. misuse: exit 2, one line, nothing written

Test(cli, misuse_unknown_flag) { MISUSE("--bogus", "unknown", "run", "--bogus"); }
Test(cli, misuse_unknown_subcommand) { MISUSE("frobnicate", "unknown", "frobnicate"); }
Test(cli, misuse_positional_argument) { MISUSE("stray", "unexpected", "run", "stray"); }

Test(cli, misuse_no_subcommand) {
    // docs/contract.md §7: bad usage is exit 2 with one clear line, as for every other misuse.
    MISUSE(NULL, "command", NULL);
}

Test(cli, misuse_flag_missing_value) { MISUSE("--steps", "value", "run", "--steps"); }
Test(cli, misuse_flag_empty_value) { MISUSE("--steps", "empty", "run", "--steps="); }
Test(cli, misuse_steps_zero) { MISUSE("--steps", "integer", "run", "--steps", "0"); }
Test(cli, misuse_steps_not_a_number) { MISUSE("abc", "integer", "run", "--steps", "abc"); }
Test(cli, misuse_steps_float_syntax) { MISUSE("1e3", "integer", "run", "--steps", "1e3"); }
Test(cli, misuse_steps_overflow) { MISUSE("99999999999", "integer", "run", "--steps", "99999999999"); }
Test(cli, misuse_lr_negative) { MISUSE("--lr", "non-negative", "run", "--lr", "-1"); }
Test(cli, misuse_lr_nan) { MISUSE("nan", "finite", "run", "--lr", "nan"); }
Test(cli, misuse_lr_inf) { MISUSE("inf", "finite", "run", "--lr", "inf"); }
Test(cli, misuse_seed_negative) { MISUSE("-5", "non-negative", "run", "--seed", "-5"); }
Test(cli, misuse_seed_overflow) {
    MISUSE("18446744073709551616", "integer", "run", "--seed", "18446744073709551616");
}
Test(cli, misuse_global_batch_zero) { MISUSE("--global-batch", "integer", "run", "--global-batch", "0"); }
Test(cli, misuse_unknown_optimizer) { MISUSE("adam", "sgd", "run", "--optimizer", "adam"); }
Test(cli, misuse_bad_norm_type) {
    MISUSE("--norm-type", "inf", "run", "--clip-grad-norm", "1", "--norm-type", "3");
}
Test(cli, misuse_unknown_strategy) { MISUSE("bogus", "full_shard", "run", "--strategy", "bogus"); }
Test(cli, misuse_clip_zero) { MISUSE("--clip-grad-norm", "positive", "run", "--clip-grad-norm", "0"); }
Test(cli, misuse_unknown_impl) { MISUSE("nosuch", "reference", "run", "--impl", "nosuch"); }
Test(cli, misuse_model_unknown_name) {
    MISUSE("nonexistent.json", "preset", "run", "--model", "nonexistent.json");
}
Test(cli, misuse_model_missing_file) {
    MISUSE("/nonexistent/config.json", "No such file", "run", "--model", "/nonexistent/config.json");
}

Test(cli, misuse_model_malformed_json) {
    const char *p = tmp_path("config.json");
    write_file(p, "{\"model_type\": \"gpt2\", ", 23);
    MISUSE("config.json", "JSON", "run", "--model", p);
}

Test(cli, misuse_model_invalid_sizes) {
    const char *p = tmp_path("config.json");
    const char *j = "{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_head\": 3, \"n_positions\": 8}";
    write_file(p, j, strlen(j));
    MISUSE("config.json", "divisible", "run", "--model", p);
}

Test(cli, misuse_activation_checkpointing_value) {
    MISUSE("'yes'", "inside", "run", "--strategy", "full_shard", "--activation-checkpointing", "yes");
}
Test(cli, misuse_activation_checkpointing_local) {
    MISUSE("--activation-checkpointing", "data-parallel", "run", "--activation-checkpointing", "inside");
}
Test(cli, misuse_gradient_checkpointing_takes_no_value) {
    MISUSE("--gradient-checkpointing", "value", "run", "--strategy", "full_shard", "--gradient-checkpointing=1");
}

Test(cli, misuse_reshard_after_forward_fsdp1) {
    MISUSE("--fsdp-version 2", "integer reshard_after_forward", "run", "--strategy", "full_shard",
           "--reshard-after-forward", "2");
}
Test(cli, misuse_reshard_after_forward_zero2) {
    MISUSE("shard_grad_op", "reshards after forward", "run", "--strategy", "shard_grad_op", "--fsdp-version", "2",
           "--reshard-after-forward", "2");
}
Test(cli, misuse_reshard_after_forward_one) {
    MISUSE("at least 2", "shard_grad_op", "run", "--strategy", "full_shard", "--fsdp-version", "2",
           "--reshard-after-forward", "1");
}

Test(cli, misuse_backward_prefetch_units_fsdp1) {
    MISUSE("--backward-prefetch-units", "--fsdp-version 2", "run", "--strategy", "full_shard",
           "--backward-prefetch-units", "2");
}
Test(cli, misuse_forward_prefetch_units_zero) {
    MISUSE("--forward-prefetch-units", "0", "run", "--strategy", "full_shard", "--fsdp-version", "2",
           "--forward-prefetch-units", "0");
}
Test(cli, misuse_gradient_divide_factor_fsdp1) {
    MISUSE("--gradient-divide-factor", "--fsdp-version 2", "run", "--strategy", "full_shard",
           "--gradient-divide-factor", "3");
}
Test(cli, misuse_gradient_divide_factor_zero) {
    MISUSE("--gradient-divide-factor", "above 0", "run", "--strategy", "full_shard", "--fsdp-version", "2",
           "--gradient-divide-factor", "0");
}

Test(cli, misuse_init_missing_file) {
    MISUSE("/nonexistent.safetensors", "No such file", "run", "--init", "/nonexistent.safetensors");
}

Test(cli, misuse_init_is_a_directory) { MISUSE(g_tmp, "regular file", "run", "--init", g_tmp); }

Test(cli, misuse_init_garbage_huge_header_length) {
    const char *p = tmp_path("fixture.safetensors");
    unsigned char g[100];
    for (int i = 0; i < 100; i++) g[i] = (unsigned char)(0xA7 ^ (i * 37));
    write_file(p, g, sizeof g);
    MISUSE("fixture.safetensors", "header", "run", "--init", p);
}

Test(cli, misuse_init_garbage_header_not_json) {
    const char *p = tmp_path("fixture.safetensors");
    const unsigned char g[] = {16, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n',
                               '!', '!', '!', '!', '!', '!', '!', '!', 1, 2, 3, 4};
    write_file(p, g, sizeof g);
    MISUSE("fixture.safetensors", "JSON", "run", "--init", p);
}

Test(cli, misuse_init_empty_file) {
    const char *p = tmp_path("fixture.safetensors");
    write_file(p, "", 0);
    MISUSE("fixture.safetensors", "0 bytes", "run", "--init", p);
}

Test(cli, misuse_init_missing_parameter) {
    const char *p = tmp_path("fixture.safetensors");
    const char *victim = write_mlp_init(p, FIX_MISSING);
    MISUSE(victim, "missing", "run", "--init", p);
}

Test(cli, misuse_init_wrong_shape) {
    const char *p = tmp_path("fixture.safetensors");
    const char *victim = write_mlp_init(p, FIX_WRONG_SHAPE);
    MISUSE(victim, "shape", "run", "--init", p);
}

Test(cli, misuse_init_wrong_dtype) {
    const char *p = tmp_path("fixture.safetensors");
    const char *victim = write_mlp_init(p, FIX_WRONG_DTYPE);
    MISUSE(victim, "I32", "run", "--init", p);
}

Test(cli, misuse_init_unknown_tensor) {
    const char *p = tmp_path("fixture.safetensors");
    const char *victim = write_mlp_init(p, FIX_EXTRA);
    MISUSE(victim, "not a parameter", "run", "--init", p);
}

Test(cli, misuse_init_for_another_model) {
    // a valid gpt2-tiny file given to the default mlp-tiny model
    const char *dir = tmp_path("gpt");
    result r;
    cr_assert_eq(run(ARGS("run", "--model", "gpt2-tiny", "--steps", "1", "--quiet", "--trace", dir), &r), 0,
                 "%s", r.err);
    result_free(&r);
    MISUSE("transformer.wte.weight", "mlp-tiny", "run", "--init", tmp_path("gpt/init.safetensors"));
}

Test(cli, misuse_batch_not_divisible_by_grad_accum) {
    MISUSE("--grad-accum", "divisible", "run", "--global-batch", "5", "--grad-accum", "2");
}
Test(cli, misuse_seq_len_beyond_n_positions) {
    MISUSE("33", "n_positions", "run", "--model", "gpt2-tiny", "--seq-len", "33");
}
Test(cli, misuse_seq_len_with_mlp) {
    MISUSE("--seq-len", "gpt2", "run", "--model", "mlp-tiny", "--seq-len", "4");
}
Test(cli, misuse_seq_len_before_mlp_model) {
    MISUSE("--seq-len", "gpt2", "run", "--seq-len", "4", "--model", "mlp-tiny");
}
Test(cli, misuse_momentum_with_adamw) { MISUSE("--momentum", "sgd", "run", "--momentum", "0.5"); }
Test(cli, misuse_norm_type_without_clip) {
    MISUSE("--norm-type", "--clip-grad-norm", "run", "--norm-type", "inf");
}
// Options that would change nothing under the chosen strategy are refused.
Test(cli, misuse_offload_with_local) { MISUSE("--cpu-offload", "data-parallel", "run", "--cpu-offload"); }
Test(cli, misuse_mixed_precision_with_local) {
    MISUSE("mixed precision", "data-parallel", "run", "--param-dtype", "bf16");
}
Test(cli, misuse_prefetch_with_no_shard) {
    MISUSE("--forward-prefetch", "sharded", "run", "--strategy", "no_shard", "--forward-prefetch");
}
Test(cli, misuse_backward_prefetch_bad_value) {
    MISUSE("sideways", "pre, post or none", "run", "--strategy", "full_shard", "--backward-prefetch", "sideways");
}
Test(cli, misuse_limit_without_prefetch) {
    MISUSE("--limit-all-gathers", "prefetch", "run", "--strategy", "full_shard", "--limit-all-gathers");
}
Test(cli, misuse_shard_group_not_hybrid) {
    MISUSE("--shard-group", "hybrid", "run", "--strategy", "full_shard", "--shard-group", "1");
}
Test(cli, misuse_shard_group_does_not_divide) {
    MISUSE("--shard-group 3", "divide", "run", "--strategy", "hybrid_shard", "--shard-group", "3");
}
Test(cli, misuse_param_dtype_bad_value) {
    MISUSE("fp8", "fp32, bf16 or fp16", "run", "--strategy", "no_shard", "--param-dtype", "fp8");
}
Test(cli, misuse_save_at_after_last_step) {
    MISUSE("--save-at", "last step", "run", "--steps", "2", "--save", "/tmp/x", "--save-at", "3");
}
Test(cli, misuse_inject_with_local) { MISUSE("--inject", "ground truth", "run", "--inject", "no_divide"); }
Test(cli, misuse_inject_unknown) {
    MISUSE("bogus_fault", "unknown fault", "run", "--strategy", "full_shard", "--inject", "bogus_fault");
}
Test(cli, misuse_value_for_switch) { MISUSE("--quiet", "no value", "run", "--quiet=1"); }
Test(cli, misuse_compare_missing_trace) { MISUSE("a", "trace", "compare", "a", "b"); }

Test(cli, misuse_trace_under_regular_file) {
    const char *work = tmp_path("work");
    make_dir(work);
    const char *f = tmp_path("work/F");
    write_file(f, "keep", 4);
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/sub", f);
    result r;
    run_in(work, ARGS("run", "--quiet", "--steps", "1", "--trace", sub), &r);
    expect_usage_error2(&r, "F", "not a directory");
    expect_listing(work, "F");
    size_t n;
    unsigned char *b = read_all(f, &n);
    cr_expect(n == 4 && !memcmp(b, "keep", 4), "the regular file was modified");
    free(b);
    result_free(&r);
}

Test(cli, misuse_trace_is_a_regular_file_prints_nothing_on_stdout) {
    // The same failure without --quiet: a usage error must not first print
    // the "fsdpcheck run: model ..." banner as if the run had started.
    const char *work = tmp_path("work");
    make_dir(work);
    const char *f = tmp_path("work/F");
    write_file(f, "keep", 4);
    result r;
    run_in(work, ARGS("run", "--steps", "1", "--trace", f), &r);
    expect_usage_error2(&r, "F", "not a directory");
    expect_listing(work, "F");
    result_free(&r);
}

Test(cli, misuse_message_is_one_line_even_with_newline_in_value) {
    // A value echoed back in the message must not break the one-line contract.
    MISUSE("--model", "preset", "run", "--model", "no\nsuch");
}

// ----------------------------------------------------------------------------
// 2. successful runs

Test(cli, help_exits_zero) {
    result r;
    cr_expect_eq(run(ARGS("--help"), &r), 0, "%s: stderr:\n%s", r.cmd, r.err);
    cr_expect_not_null(strstr(r.out, "usage"), "--help printed:\n%s", r.out);
    cr_expect_eq(r.err_len, 0, "--help wrote on stderr:\n%s", r.err);
    result_free(&r);
    cr_expect_eq(run(ARGS("run", "--help"), &r), 0, "%s: stderr:\n%s", r.cmd, r.err);
    cr_expect_not_null(strstr(r.out, "--steps"), "run --help printed:\n%s", r.out);
    cr_expect_not_null(strstr(r.out, "--trace"), "run --help printed:\n%s", r.out);
    cr_expect_eq(r.err_len, 0, "run --help wrote on stderr:\n%s", r.err);
    result_free(&r);
}

// A trace directory must hold exactly these names.
static void expect_trace_files(const char *dir, int steps) {
    char want[4096] = "init.safetensors";
    size_t n = strlen(want);
    for (int t = 0; t < steps; t++)
        n += (size_t)snprintf(want + n, sizeof want - n, " step-%06d.safetensors", t);
    snprintf(want + n, sizeof want - n, " trace.json");
    expect_listing(dir, want);  // also proves no "*.tmp.*" is left
}

static void expect_trace_json(const char *dir, int steps, const char *model, const char *optimizer,
                              const char *seed) {
    char p[1100];
    snprintf(p, sizeof p, "%s/trace.json", dir);
    cJSON *j = load_json(p);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    cr_expect(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "fsdpcheck-trace"), "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    cr_expect(cJSON_IsNumber(ver) && ver->valuedouble == 1, "version");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "world_size");
    cr_expect(cJSON_IsNumber(ws) && ws->valuedouble == 1, "world_size");
    const cJSON *impl = cJSON_GetObjectItemCaseSensitive(j, "implementation");
    cr_expect(cJSON_IsString(impl) && !strcmp(impl->valuestring, "reference"), "implementation");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    cr_assert(cJSON_IsObject(cfg), "trace.json has no config object");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cfg, "steps");
    cr_expect(cJSON_IsNumber(st) && st->valuedouble == steps, "config.steps is not %d", steps);
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(cfg, "seed");
    cr_expect(cJSON_IsString(sd) && !strcmp(sd->valuestring, seed), "config.seed is not \"%s\"", seed);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cfg, "model");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(m, "fsdpcheck_name");
    cr_expect(cJSON_IsString(mn) && !strcmp(mn->valuestring, model), "config.model is not %s", model);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(cfg, "optimizer");
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "kind");
    cr_expect(cJSON_IsString(ok) && !strcmp(ok->valuestring, optimizer), "config.optimizer.kind is not %s",
              optimizer);
    cJSON_Delete(j);
}

static void load_model(const char *name, fc_model *m) {
    fc_model_config cfg;
    fc_error e;
    cr_assert_eq(fc_model_config_load(name, &cfg, &e), 0, "%s", e.msg);
    fc_model_build(m, &cfg);
}

// Checks tensor `name` exists with this dtype and shape; returns it.
static const fc_st_tensor *expect_tensor(const fc_st_file *f, const char *file, const char *name,
                                         fc_dtype dt, int ndim, uint64_t d0, uint64_t d1) {
    const fc_st_tensor *t = fc_st_find(f, name);
    cr_expect_not_null(t, "%s: no tensor %s", file, name);
    if (!t) return NULL;
    cr_expect_eq(t->dtype, dt, "%s: %s has dtype %s, want %s", file, name, fc_dtype_name(t->dtype),
                 fc_dtype_name(dt));
    cr_expect_eq(t->ndim, ndim, "%s: %s has %d dims, want %d", file, name, t->ndim, ndim);
    if (ndim >= 1) cr_expect_eq(t->shape[0], d0, "%s: %s dim 0", file, name);
    if (ndim >= 2) cr_expect_eq(t->shape[1], d1, "%s: %s dim 1", file, name);
    return t;
}

static void expect_init_file(const char *dir, const fc_model *m) {
    char p[1100];
    snprintf(p, sizeof p, "%s/init.safetensors", dir);
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(p, &f, &e), 0, "%s", e.msg);
    cr_expect_eq(f.n_tensors, m->n_params, "%s: %d tensors, want %d", p, f.n_tensors, m->n_params);
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *q = &m->params[i];
        expect_tensor(&f, p, q->name, FC_DT_F32, q->ndim, (uint64_t)q->shape[0], (uint64_t)q->shape[1]);
    }
    fc_st_close(&f);
}

// Parses step file `t` of a trace and checks every tensor the contract names.
static void expect_step_file(const char *dir, int step, const fc_model *m, int B, int T, int sgd) {
    char p[1100];
    snprintf(p, sizeof p, "%s/step-%06d.safetensors", dir, step);
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(p, &f, &e), 0, "%s", e.msg);
    const char *states_adamw[] = {"exp_avg", "exp_avg_sq"};
    const char *states_sgd[] = {"momentum_buffer"};
    const char **states = sgd ? states_sgd : states_adamw;
    int n_states = sgd ? 1 : 2;
    // loss, grad_norm, the batch, then grads, params and each state per parameter
    cr_expect_eq(f.n_tensors, 4 + (2 + n_states) * m->n_params, "%s: %d tensors, want %d", p, f.n_tensors,
                 4 + (2 + n_states) * m->n_params);
    const fc_st_tensor *norm = expect_tensor(&f, p, "grad_norm", FC_DT_F64, 0, 0, 0);
    if (norm) {  // the reference records the norm it computed, clipping or not
        double g = NAN;
        cr_assert_eq(fc_st_read(&f, norm, 0, 1, &g, &e), 0, "%s", e.msg);
        cr_expect(isfinite(g) && g > 0, "%s: grad_norm %g", p, g);
    }

    const fc_st_tensor *loss = expect_tensor(&f, p, "loss", FC_DT_F32, 0, 0, 0);
    if (loss) {
        float l = NAN;
        cr_assert_eq(fc_st_read_f32(&f, loss, 0, 1, &l, &e), 0, "%s", e.msg);
        cr_expect(isfinite(l) && l > 0, "%s: loss %g", p, l);
    }
    if (m->cfg.kind == FC_MODEL_GPT2) {
        const fc_st_tensor *in = expect_tensor(&f, p, "batch.input", FC_DT_I32, 2, (uint64_t)B, (uint64_t)T);
        const fc_st_tensor *tg = expect_tensor(&f, p, "batch.target", FC_DT_I32, 2, (uint64_t)B, (uint64_t)T);
        if (in && tg && in->numel == (uint64_t)B * T && tg->numel == (uint64_t)B * T) {
            int32_t *x = calloc((size_t)B * T, 4), *y = calloc((size_t)B * T, 4);
            cr_assert_eq(fc_st_read(&f, in, 0, in->numel, x, &e), 0, "%s", e.msg);
            cr_assert_eq(fc_st_read(&f, tg, 0, tg->numel, y, &e), 0, "%s", e.msg);
            for (int i = 0; i < B * T; i++) {
                cr_expect(x[i] >= 0 && x[i] < m->cfg.vocab_size && y[i] >= 0 && y[i] < m->cfg.vocab_size,
                          "%s: token out of range at %d", p, i);
                // T+1 tokens per sample: target is input shifted by one
                if (i % T != T - 1)
                    cr_expect_eq(y[i], x[i + 1], "%s: batch.target[%d] != batch.input[%d]", p, i, i + 1);
            }
            free(x);
            free(y);
        }
    } else {
        expect_tensor(&f, p, "batch.input", FC_DT_F32, 2, (uint64_t)B, (uint64_t)m->cfg.dims[0]);
        const fc_st_tensor *tg = expect_tensor(&f, p, "batch.target", FC_DT_I32, 1, (uint64_t)B, 0);
        if (tg && tg->numel == (uint64_t)B) {
            int32_t y[1024];
            cr_assert_leq(B, 1024);
            cr_assert_eq(fc_st_read(&f, tg, 0, tg->numel, y, &e), 0, "%s", e.msg);
            for (int i = 0; i < B; i++)
                cr_expect(y[i] >= 0 && y[i] < m->cfg.dims[m->cfg.n_layers], "%s: class %d out of range", p,
                          y[i]);
        }
    }
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *q = &m->params[i];
        char name[256];
        uint64_t d0 = (uint64_t)q->shape[0], d1 = (uint64_t)q->shape[1];
        snprintf(name, sizeof name, "grad.%s", q->name);
        expect_tensor(&f, p, name, FC_DT_F32, q->ndim, d0, d1);
        snprintf(name, sizeof name, "param.%s", q->name);
        expect_tensor(&f, p, name, FC_DT_F32, q->ndim, d0, d1);
        for (int s = 0; s < n_states; s++) {
            snprintf(name, sizeof name, "optim.%s.%s", states[s], q->name);
            expect_tensor(&f, p, name, FC_DT_F32, q->ndim, d0, d1);
        }
    }
    // and not the other optimizer's state
    char other[256];
    snprintf(other, sizeof other, sgd ? "optim.exp_avg.%s" : "optim.momentum_buffer.%s", m->params[0].name);
    cr_expect_null(fc_st_find(&f, other), "%s: holds %s", p, other);
    fc_st_close(&f);
}

static void expect_ok(const result *r) {
    cr_expect_eq(r->code, 0, "%s: exit %d (signal %d); stderr:\n%s", r->cmd, r->code, r->signal, r->err);
    cr_expect_eq(r->err_len, 0, "%s: wrote on stderr:\n%s", r->cmd, r->err);
}

Test(cli, run_gpt2_trace_contents) {
    const char *dir = tmp_path("trace");
    result r;
    run(ARGS("run", "--model", "gpt2-tiny", "--steps", "2", "--trace", dir), &r);
    expect_ok(&r);
    cr_expect_not_null(strstr(r.out, "step 1"), "no per-step line on stdout:\n%s", r.out);
    result_free(&r);
    expect_trace_files(dir, 2);
    expect_trace_json(dir, 2, "gpt2-tiny", "adamw", "1234");
    fc_model m;
    load_model("gpt2-tiny", &m);
    expect_init_file(dir, &m);
    for (int t = 0; t < 2; t++) expect_step_file(dir, t, &m, 8, 16, 0);
    fc_model_free(&m);
}

Test(cli, run_mlp_sgd_trace_contents) {
    const char *dir = tmp_path("trace");
    result r;
    run(ARGS("run", "--model", "mlp-tiny", "--optimizer", "sgd", "--momentum", "0.5", "--steps", "3",
             "--global-batch", "6", "--grad-accum", "3", "--quiet", "--trace", dir),
        &r);
    expect_ok(&r);
    cr_expect_eq(r.out_len, 0, "--quiet printed:\n%s", r.out);
    result_free(&r);
    expect_trace_files(dir, 3);
    expect_trace_json(dir, 3, "mlp-tiny", "sgd", "1234");
    fc_model m;
    load_model("mlp-tiny", &m);
    expect_init_file(dir, &m);
    for (int t = 0; t < 3; t++) expect_step_file(dir, t, &m, 6, 0, 1);
    fc_model_free(&m);
}

Test(cli, run_gpt2_sgd_trace_contents) {
    const char *dir = tmp_path("trace");
    result r;
    run(ARGS("run", "--model", "gpt2-tiny", "--optimizer", "sgd", "--steps", "1", "--global-batch", "2",
             "--seq-len", "5", "--clip-grad-norm", "0.1", "--norm-type", "inf", "--quiet", "--trace", dir),
        &r);
    expect_ok(&r);
    result_free(&r);
    expect_trace_files(dir, 1);
    fc_model m;
    load_model("gpt2-tiny", &m);
    expect_step_file(dir, 0, &m, 2, 5, 1);
    fc_model_free(&m);
}

Test(cli, flags_with_equals_sign) {
    const char *dir = tmp_path("trace");
    char trace_flag[1200];
    snprintf(trace_flag, sizeof trace_flag, "--trace=%s", dir);
    result r;
    run(ARGS("run", "--model=gpt2-tiny", "--steps=2", "--seed=99", "--global-batch=2", "--seq-len=4",
             "--quiet", trace_flag),
        &r);
    expect_ok(&r);
    result_free(&r);
    expect_trace_files(dir, 2);
    expect_trace_json(dir, 2, "gpt2-tiny", "adamw", "99");
    fc_model m;
    load_model("gpt2-tiny", &m);
    expect_step_file(dir, 1, &m, 2, 4, 0);
    fc_model_free(&m);
}

Test(cli, run_without_trace_writes_nothing) {
    const char *work = tmp_path("work");
    make_dir(work);
    result r;
    run_in(work, ARGS("run", "--model", "gpt2-tiny", "--steps", "1", "--global-batch", "2", "--seq-len", "4"),
           &r);
    expect_ok(&r);
    cr_expect_not_null(strstr(r.out, "step 0"), "no step line:\n%s", r.out);
    result_free(&r);
    expect_listing(work, "");
}

static void trace_run(const char *dir, const char *seed, const char *init) {
    result r;
    if (init)
        run(ARGS("run", "--model", "gpt2-tiny", "--steps", "2", "--global-batch", "4", "--seq-len", "8",
                 "--seed", seed, "--quiet", "--init", init, "--trace", dir),
            &r);
    else
        run(ARGS("run", "--model", "gpt2-tiny", "--steps", "2", "--global-batch", "4", "--seq-len", "8",
                 "--seed", seed, "--quiet", "--trace", dir),
            &r);
    expect_ok(&r);
    result_free(&r);
    expect_trace_files(dir, 2);
}

static const char *const TRACE_FILES[] = {"init.safetensors", "step-000000.safetensors",
                                          "step-000001.safetensors"};

Test(cli, same_run_twice_is_byte_identical) {
    const char *a = tmp_path("a"), *b = tmp_path("b");
    trace_run(a, "7", NULL);
    trace_run(b, "7", NULL);
    for (int i = 0; i < 3; i++)
        cr_expect(same_bytes(tmp_path("a/%s", TRACE_FILES[i]), tmp_path("b/%s", TRACE_FILES[i])),
                  "P12: %s differs between two identical runs", TRACE_FILES[i]);
    cr_expect(same_bytes(tmp_path("a/trace.json"), tmp_path("b/trace.json")), "trace.json differs");
}

// The F32 data of one tensor.
static float *read_tensor(const char *path, const char *name, size_t *n) {
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    const fc_st_tensor *t = fc_st_find(&f, name);
    cr_assert_not_null(t, "%s: no %s", path, name);
    float *x = calloc(t->numel, sizeof(float));
    cr_assert_eq(fc_st_read_f32(&f, t, 0, t->numel, x, &e), 0, "%s", e.msg);
    *n = t->numel;
    fc_st_close(&f);
    return x;
}

Test(cli, different_seed_gives_different_init) {
    const char *a = tmp_path("a"), *b = tmp_path("b");
    trace_run(a, "7", NULL);
    trace_run(b, "8", NULL);
    fc_model m;
    load_model("gpt2-tiny", &m);
    for (int i = 0; i < m.n_params; i++) {
        const fc_param *q = &m.params[i];
        if (q->init != FC_INIT_NORMAL && q->init != FC_INIT_UNIFORM) continue;  // zeros/ones are seed-free
        size_t na, nb;
        float *x = read_tensor(tmp_path("a/init.safetensors"), q->name, &na);
        float *y = read_tensor(tmp_path("b/init.safetensors"), q->name, &nb);
        cr_assert_eq(na, nb);
        size_t same = 0;
        for (size_t k = 0; k < na; k++) same += x[k] == y[k];
        cr_expect_lt(same, na / 10 + 1, "%s: %zu of %zu elements equal under seeds 7 and 8", q->name, same,
                     na);
        free(x);
        free(y);
    }
    fc_model_free(&m);
}

Test(cli, init_from_own_trace_reproduces_run) {
    const char *a = tmp_path("a"), *c = tmp_path("c");
    trace_run(a, "7", NULL);
    // weights from the file == weights from the seed; the seed still drives the data
    trace_run(c, "7", tmp_path("a/init.safetensors"));
    for (int i = 0; i < 3; i++)
        cr_expect(same_bytes(tmp_path("a/%s", TRACE_FILES[i]), tmp_path("c/%s", TRACE_FILES[i])),
                  "--init of a run's own init.safetensors: %s differs", TRACE_FILES[i]);
}

Test(cli, init_handwritten_file_is_used) {
    // the positive control for the --init misuse fixtures: the writer above
    // produces a file the CLI accepts, and its values are what the run starts from
    const char *p = tmp_path("good.safetensors");
    write_mlp_init(p, FIX_GOOD);
    const char *dir = tmp_path("trace");
    result r;
    run(ARGS("run", "--init", p, "--steps", "1", "--quiet", "--trace", dir), &r);
    expect_ok(&r);
    result_free(&r);
    expect_trace_files(dir, 1);
    size_t n;
    float *w = read_tensor(tmp_path("trace/init.safetensors"), "layers.1.weight", &n);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(w[i], 0.01f * (float)((i * 7) % 23) - 0.1f, "init element %zu is not the file's", i);
    free(w);
}

// ----------------------------------------------------------------------------
// trace integrity beyond a fresh directory

Test(cli, rerun_into_existing_trace_dir_leaves_no_stale_steps) {
    // A trace must describe one run: after a 3-step trace, a 2-step run into
    // the same DIR either refuses (exit 2, one line) or leaves exactly a
    // 2-step trace, never trace.json {"steps": 2} beside a stale step-000002.
    const char *dir = tmp_path("trace");
    result r;
    run(ARGS("run", "--steps", "3", "--quiet", "--trace", dir), &r);
    expect_ok(&r);
    result_free(&r);
    run(ARGS("run", "--steps", "2", "--quiet", "--trace", dir), &r);
    if (r.code == 2) {
        expect_usage_error2(&r, dir, "trace");
    } else {
        expect_ok(&r);
        expect_trace_files(dir, 2);
    }
    result_free(&r);
}

Test(cli, failed_trace_write_leaves_no_trace_json) {
    // step-000001 cannot be written (a directory holds its name): the run must
    // fail with one line, and DIR must not look like a valid (shorter) trace.
    const char *dir = tmp_path("trace");
    make_dir(dir);
    make_dir(tmp_path("trace/step-000001.safetensors"));
    result r;
    run(ARGS("run", "--steps", "2", "--quiet", "--trace", dir), &r);
    cr_expect(r.code == 2 || r.code == 4, "%s: exit %d, want 2 or 4 (an I/O failure); stderr:\n%s", r.cmd, r.code, r.err);
    cr_expect_eq(count_lines(r.err, r.err_len), 1, "%s: stderr:\n%s", r.cmd, r.err);
    cr_expect(strncmp(r.err, "fsdpcheck: ", 11) == 0, "%s: stderr:\n%s", r.cmd, r.err);
    result_free(&r);
    cr_expect_not(exists(tmp_path("trace/trace.json")),
                  "a failed run left trace.json, so DIR reads as a complete 1-step trace");
    char got[8192];
    dir_listing(dir, got, sizeof got);
    cr_expect_null(strstr(got, ".tmp."), "temporary left behind: [%s]", got);
}
