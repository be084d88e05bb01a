// tests/unit/test_checkpoint_files.c — checkpoints (docs/contract.md §6), single process:
// the core reader/writer in-process (core/checkpoint.h), and the fsdpcheck
// binary run as a user runs it (fork + execv of FC_FSDPCHECK_BIN, the
// environment variable of the same name overrides it; strategy local, so no
// mpiexec is needed and no MPI runs inside Criterion).
//
//  - the files: model.safetensors with Hugging Face names, F32, the tied
//    head not repeated, {"format": "pt"}; config.json; optimizer.safetensors
//    with every state and the step; the manifest with every key, each file's
//    size and SHA-256 (checked against OpenSSL's test vector and the files);
//  - a resumed run writes the uninterrupted run's step files byte for byte,
//    with global step numbers, from FULL and SHARDED checkpoints;
//  - every file corrupted (a flipped byte), truncated, or missing, and the
//    manifest missing or broken in many ways: `ckpt verify` and `run --load`
//    exit 2 with one line on stderr naming the file and the problem, and
//    the run writes nothing;
//  - incompatible checkpoints (another model, another optimizer) are refused;
//  - `ckpt convert` full <-> sharded round trips byte for byte;
//  - reading a range reads only that range's bytes.
#include <criterion/criterion.h>

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "model.h"
#include "safetensors.h"

#define RUN_TIMEOUT_S 60
#include "cli_harness.h"

// ----------------------------------------------------------------------------
// one temporary directory per test, and files

static void setup(void) { tmp_setup("fc_test_ckpt"); }

TestSuite(ckpt, .init = setup, .fini = tmp_teardown, .timeout = 300);

static void copy_dir(const char *src, const char *dst) {
    cr_assert_eq(mkdir(dst, 0777), 0, "mkdir %s: %s", dst, strerror(errno));
    DIR *d = opendir(src);
    cr_assert_not_null(d);
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char a[2048], b[2048];
        snprintf(a, sizeof a, "%s/%s", src, ent->d_name);
        snprintf(b, sizeof b, "%s/%s", dst, ent->d_name);
        size_t n;
        unsigned char *data = read_all(a, &n);
        write_file(b, data, n);
        free(data);
    }
    closedir(d);
}

// ----------------------------------------------------------------------------
// expectations

static void expect_ok(const result *r) {
    cr_assert_eq(r->code, 0, "%s: exit %d (signal %d); stderr:\n%s", r->cmd, r->code, r->signal, r->err);
}

// exit 2, nothing on stdout, one "fsdpcheck: " line on stderr holding each
// of the given substrings (NULL-terminated)
static void expect_refused(const result *r, const char *const *want) {
    cr_expect_eq(r->code, 2, "%s: exit %d (signal %d), want 2; stderr:\n%s", r->cmd, r->code, r->signal, r->err);
    cr_expect_eq(r->out_len, 0, "%s: printed on stdout:\n%s", r->cmd, r->out);
    cr_expect(count_lines(r->err, r->err_len) == 1 && r->err_len && r->err[r->err_len - 1] == '\n',
              "%s: stderr must be one line:\n%s", r->cmd, r->err);
    cr_expect(strncmp(r->err, "fsdpcheck: ", 11) == 0, "%s: stderr does not start with 'fsdpcheck: ':\n%s", r->cmd,
              r->err);
    for (int i = 0; want[i]; i++)
        cr_expect_not_null(strstr(r->err, want[i]), "%s: stderr does not say '%s':\n%s", r->cmd, want[i], r->err);
}
#define REFUSED(r, ...) expect_refused((r), ARGS(__VA_ARGS__))

// A checkpoint of mlp-tiny (or gpt2-tiny) from `local` after `steps` steps.
static const char *make_ckpt(const char *name, const char *model, const char *kind, const char *steps,
                             const char *optimizer) {
    const char *dir = tmp_path("%s", name);
    result r;
    run_in(NULL, ARGS("run", "--quiet", "--model", model, "--optimizer", optimizer, "--steps", steps, "--save", dir,
                      "--state-dict", kind),
           &r);
    expect_ok(&r);
    result_free(&r);
    return dir;
}

// `ckpt verify DIR` and `run --load DIR` (with --trace into an empty work
// directory, which must stay empty) must both refuse with these words.
static void expect_both_refuse(const char *dir, const char *model, const char *const *want) {
    result r;
    run_in(NULL, ARGS("ckpt", "verify", dir), &r);
    expect_refused(&r, want);
    result_free(&r);
    const char *work = tmp_path("work");
    remove_tree(work);
    cr_assert_eq(mkdir(work, 0777), 0);
    run_in(work, ARGS("run", "--quiet", "--model", model, "--steps", "1", "--load", dir, "--trace", "trace", "--save",
                      "saved"),
           &r);
    expect_refused(&r, want);
    expect_listing(work, "");  // nothing half-written
    result_free(&r);
}

// ----------------------------------------------------------------------------
// 1. the files

Test(ckpt, sha256_is_openssl_sha256) {
    // FIPS 180-2 test vector
    char hex[65];
    fc_sha256_mem("abc", 3, hex);
    cr_expect_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    fc_sha256_mem("", 0, hex);
    cr_expect_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

Test(ckpt, full_checkpoint_files) {
    const char *dir = make_ckpt("ck", "gpt2-tiny", "full", "3", "adamw");
    expect_listing(dir, "config.json fsdpcheck.json model.safetensors optimizer.safetensors");
    fc_model_config mc;
    fc_error e;
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &mc, &e), 0);
    fc_model m;
    fc_model_build(&m, &mc);
    // model.safetensors: Hugging Face names, F32, no lm_head, format pt
    fc_st_file f;
    cr_assert_eq(fc_st_open(tmp_path("ck/model.safetensors"), &f, &e), 0, "%s", e.msg);
    cr_expect_str_eq(fc_st_meta(&f, "format"), "pt");
    cr_expect_eq(f.n_tensors, m.n_params, "model.safetensors holds %d tensors, the model %d", f.n_tensors, m.n_params);
    cr_expect_null(fc_st_find(&f, "lm_head.weight"), "the tied head is repeated");
    for (int i = 0; i < m.n_params; i++) {
        const fc_st_tensor *t = fc_st_find(&f, m.params[i].name);
        cr_assert_not_null(t, "%s missing", m.params[i].name);
        cr_expect_eq(t->dtype, FC_DT_F32);
        cr_expect_eq(t->ndim, m.params[i].ndim);
        cr_expect_eq(t->shape[0], (uint64_t)m.params[i].shape[0]);
    }
    fc_st_close(&f);
    // optimizer.safetensors: the step and every state by model name
    cr_assert_eq(fc_st_open(tmp_path("ck/optimizer.safetensors"), &f, &e), 0, "%s", e.msg);
    const fc_st_tensor *st = fc_st_find(&f, "step");
    cr_assert_not_null(st);
    cr_expect(st->dtype == FC_DT_I64 && st->ndim == 0);
    int64_t step = 0;
    cr_assert_eq(fc_st_read(&f, st, 0, 1, &step, &e), 0);
    cr_expect_eq(step, 3);
    cr_expect_eq(f.n_tensors, 1 + 2 * m.n_params);
    cr_expect_not_null(fc_st_find(&f, "exp_avg.transformer.wte.weight"));
    cr_expect_not_null(fc_st_find(&f, "exp_avg_sq.transformer.h.1.mlp.c_proj.bias"));
    fc_st_close(&f);
    // config.json: Hugging Face GPT-2 fields
    cJSON *cj = load_json(tmp_path("ck/config.json"));
    cr_expect_str_eq(cJSON_GetObjectItem(cj, "model_type")->valuestring, "gpt2");
    cr_expect_eq(cJSON_GetObjectItem(cj, "n_embd")->valueint, 16);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(cj, "tie_word_embeddings")));
    cJSON_Delete(cj);
    // the manifest: every key, and each file's size and SHA-256
    cJSON *j = load_json(tmp_path("ck/fsdpcheck.json"));
    const char *keys[] = {"format", "version", "state_dict", "step", "data_position", "world_size", "strategy",
                          "model", "optimizer", "config", "files"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_expect_not_null(cJSON_GetObjectItem(j, keys[i]), "manifest has no \"%s\"", keys[i]);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "format")->valuestring, "fsdpcheck-checkpoint");
    cr_expect_str_eq(cJSON_GetObjectItem(j, "state_dict")->valuestring, "full");
    cr_expect_eq(cJSON_GetObjectItem(j, "step")->valueint, 3);
    cr_expect_eq(cJSON_GetObjectItem(j, "data_position")->valueint, 3);
    cr_expect_eq(cJSON_GetObjectItem(j, "world_size")->valueint, 1);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "strategy")->valuestring, "local");
    const cJSON *files = cJSON_GetObjectItem(j, "files");
    cr_assert_eq(cJSON_GetArraySize(files), 3);
    for (const cJSON *fe = files->child; fe; fe = fe->next) {
        const char *name = cJSON_GetObjectItem(fe, "name")->valuestring;
        char hex[65];
        uint64_t size;
        cr_assert_eq(fc_sha256_file(tmp_path("ck/%s", name), &size, hex, &e), 0);
        cr_expect_str_eq(cJSON_GetObjectItem(fe, "sha256")->valuestring, hex, "%s: hash", name);
        cr_expect_eq((uint64_t)cJSON_GetObjectItem(fe, "bytes")->valuedouble, size, "%s: size", name);
    }
    cJSON_Delete(j);
    fc_model_free(&m);
    result r;
    run_in(NULL, ARGS("ckpt", "verify", dir), &r);
    expect_ok(&r);
    cr_expect_not_null(strstr(r.out, "valid"));
    result_free(&r);
    run_in(NULL, ARGS("ckpt", "inspect", dir), &r);
    expect_ok(&r);
    cr_expect_not_null(strstr(r.out, "transformer.h.1.attn.c_attn.weight"), "inspect lists no tensors:\n%s", r.out);
    cr_expect_not_null(strstr(r.out, "step        3"), "inspect:\n%s", r.out);
    result_free(&r);
}

// ----------------------------------------------------------------------------
// 2. resuming: the uninterrupted run's step files, byte for byte

static void resume_case(const char *kind, const char *optimizer) {
    const char *full = tmp_path("uninterrupted"), *part = tmp_path("resumed"), *ck = tmp_path("ck");
    result r;
    run_in(NULL, ARGS("run", "--quiet", "--model", "gpt2-tiny", "--optimizer", optimizer, "--steps", "5", "--trace",
                      full),
           &r);
    expect_ok(&r);
    result_free(&r);
    run_in(NULL, ARGS("run", "--quiet", "--model", "gpt2-tiny", "--optimizer", optimizer, "--steps", "4", "--save", ck,
                      "--save-at", "3", "--state-dict", kind),
           &r);
    expect_ok(&r);
    result_free(&r);
    run_in(NULL, ARGS("run", "--quiet", "--model", "gpt2-tiny", "--optimizer", optimizer, "--steps", "2", "--load", ck,
                      "--trace", part),
           &r);
    expect_ok(&r);
    result_free(&r);
    expect_listing(part, "init.safetensors step-000003.safetensors step-000004.safetensors trace.json");
    for (int s = 3; s <= 4; s++) {
        char a[1100], b[1100];
        snprintf(a, sizeof a, "%s/step-%06d.safetensors", full, s);
        snprintf(b, sizeof b, "%s/step-%06d.safetensors", part, s);
        cr_expect(same_bytes(a, b), "%s %s: resumed step %d differs from the uninterrupted run", kind, optimizer, s);
    }
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/trace.json", part);
    cJSON *j = load_json(tj);
    cr_expect_eq(cJSON_GetObjectItem(j, "first_step")->valueint, 3);
    cJSON_Delete(j);
}

Test(ckpt, resume_full_adamw_is_bitwise) { resume_case("full", "adamw"); }
Test(ckpt, resume_sharded_sgd_is_bitwise) { resume_case("sharded", "sgd"); }

Test(ckpt, save_into_existing_checkpoint_replaces_it) {
    const char *dir = make_ckpt("ck", "mlp-tiny", "sharded", "2", "adamw");
    expect_listing(dir, "config.json fsdpcheck.json shard-00000.safetensors");
    make_ckpt("ck", "mlp-tiny", "full", "1", "adamw");
    expect_listing(dir, "config.json fsdpcheck.json model.safetensors optimizer.safetensors");
    cJSON *j = load_json(tmp_path("ck/fsdpcheck.json"));
    cr_expect_eq(cJSON_GetObjectItem(j, "step")->valueint, 1);
    cJSON_Delete(j);
    // the first thing a save does is remove the manifest
    fc_error e;
    cr_assert_eq(fc_ckpt_prepare_dir(dir, &e), 0, "%s", e.msg);
    cr_expect_not(exists(tmp_path("ck/fsdpcheck.json")));
    fc_ckpt *c;
    cr_expect_neq(fc_ckpt_open(dir, 1, &c, &e), 0);
    cr_expect_not_null(strstr(e.msg, "no fsdpcheck.json"), "%s", e.msg);
}

Test(ckpt, save_into_a_directory_that_is_no_checkpoint_keeps_its_files) {
    // someone else's model.safetensors stays; a temporary of an interrupted save goes
    const char *dir = tmp_path("d");
    cr_assert_eq(mkdir(dir, 0777), 0);
    write_file(tmp_path("d/model.safetensors"), "theirs", 6);
    write_file(tmp_path("d/shard-00003.safetensors.tmp.99"), "partial", 7);
    write_file(tmp_path("d/notes.txt"), "keep", 4);
    fc_error e;
    cr_assert_eq(fc_ckpt_prepare_dir(dir, &e), 0, "%s", e.msg);
    expect_listing(dir, "model.safetensors notes.txt");
    make_ckpt("d", "mlp-tiny", "sharded", "1", "adamw");
    expect_listing(dir, "config.json fsdpcheck.json model.safetensors notes.txt shard-00000.safetensors");
    result r;
    run_in(NULL, ARGS("ckpt", "verify", dir), &r);  // an unlisted file is no part of it
    expect_ok(&r);
    result_free(&r);
}

// ----------------------------------------------------------------------------
// 3. corrupted, truncated and missing files

static const char *FULL_FILES[] = {"config.json", "model.safetensors", "optimizer.safetensors", NULL};
static const char *SHARDED_FILES[] = {"config.json", "shard-00000.safetensors", NULL};

static void flip_byte(const char *path, size_t at) {
    size_t n;
    unsigned char *b = read_all(path, &n);
    cr_assert_lt(at, n);
    b[at] ^= 0x20;
    write_file(path, b, n);
    free(b);
}

static size_t file_size(const char *path) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    return (size_t)st.st_size;
}

static void corruption_cases(const char *kind, const char **names) {
    char good[1024];  // tmp_path's buffers rotate: keep our own copy
    snprintf(good, sizeof good, "%s", make_ckpt("good", "mlp-tiny", kind, "2", "adamw"));
    for (int i = 0; names[i]; i++) {
        // a byte flipped in the header / first bytes, and one in the middle
        size_t size = file_size(tmp_path("good/%s", names[i]));
        size_t at[2] = {10, size / 2};
        for (int k = 0; k < 2; k++) {
            char bad[1024];
            snprintf(bad, sizeof bad, "%s", tmp_path("bad"));
            remove_tree(bad);
            copy_dir(good, bad);
            flip_byte(tmp_path("bad/%s", names[i]), at[k]);
            expect_both_refuse(bad, "mlp-tiny", ARGS(names[i], "SHA-256"));
        }
        // truncated to half, and to nothing
        for (int k = 0; k < 2; k++) {
            char bad[1024];
            snprintf(bad, sizeof bad, "%s", tmp_path("bad"));
            remove_tree(bad);
            copy_dir(good, bad);
            cr_assert_eq(truncate(tmp_path("bad/%s", names[i]), k ? 0 : (off_t)(size / 2)), 0);
            expect_both_refuse(bad, "mlp-tiny", ARGS(names[i], "truncated"));
        }
        // missing
        char bad[1024];
        snprintf(bad, sizeof bad, "%s", tmp_path("bad"));
        remove_tree(bad);
        copy_dir(good, bad);
        cr_assert_eq(unlink(tmp_path("bad/%s", names[i])), 0);
        expect_both_refuse(bad, "mlp-tiny", ARGS(names[i], "missing"));
    }
    // the manifest: missing, truncated, a byte flipped
    char bad[1024];
    snprintf(bad, sizeof bad, "%s", tmp_path("bad"));
    remove_tree(bad);
    copy_dir(good, bad);
    cr_assert_eq(unlink(tmp_path("bad/fsdpcheck.json")), 0);
    expect_both_refuse(bad, "mlp-tiny", ARGS("fsdpcheck.json", "manifest"));
    remove_tree(bad);
    copy_dir(good, bad);
    cr_assert_eq(truncate(tmp_path("bad/fsdpcheck.json"), (off_t)(file_size(tmp_path("good/fsdpcheck.json")) / 2)), 0);
    expect_both_refuse(bad, "mlp-tiny", ARGS("fsdpcheck.json", "JSON"));
    remove_tree(bad);
    copy_dir(good, bad);
    size_t n;
    unsigned char *text = read_all(tmp_path("good/fsdpcheck.json"), &n);
    char *fmt = strstr((char *)text, "fsdpcheck-checkpoint");
    cr_assert_not_null(fmt);
    flip_byte(tmp_path("bad/fsdpcheck.json"), (size_t)(fmt - (char *)text) + 3);
    free(text);
    expect_both_refuse(bad, "mlp-tiny", ARGS("fsdpcheck.json", "format"));
}

Test(ckpt, full_corrupted_truncated_missing_refused) { corruption_cases("full", FULL_FILES); }
Test(ckpt, sharded_corrupted_truncated_missing_refused) { corruption_cases("sharded", SHARDED_FILES); }

Test(ckpt, no_such_directory_refused) {
    expect_both_refuse(tmp_path("nothing-here"), "mlp-tiny", ARGS("nothing-here", "no such checkpoint"));
    // a directory without a manifest: an interrupted save
    cr_assert_eq(mkdir(tmp_path("empty"), 0777), 0);
    expect_both_refuse(tmp_path("empty"), "mlp-tiny", ARGS("no fsdpcheck.json manifest"));
}

// A manifest edited in place (and its hash therefore unchecked: the manifest
// carries the hashes of the others) must still be refused when it lies.
static void rewrite_manifest(const char *src_dir, const char *dst_dir, const char *from, const char *to) {
    remove_tree(dst_dir);
    copy_dir(src_dir, dst_dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/fsdpcheck.json", dst_dir);
    size_t n;
    char *text = (char *)read_all(path, &n);
    char *at = strstr(text, from);
    cr_assert_not_null(at, "manifest has no '%s'", from);
    size_t a = (size_t)(at - text), lf = strlen(from), lt = strlen(to);
    char *out = malloc(n - lf + lt + 1);
    memcpy(out, text, a);
    memcpy(out + a, to, lt);
    memcpy(out + a + lt, at + lf, n - a - lf);
    write_file(path, out, n - lf + lt);
    free(out);
    free(text);
}

Test(ckpt, lying_manifests_refused) {
    char good[1024], bad[1024];
    snprintf(good, sizeof good, "%s", make_ckpt("good", "mlp-tiny", "full", "2", "adamw"));
    snprintf(bad, sizeof bad, "%s", tmp_path("bad"));
    struct {
        const char *from, *to, *file, *want;
    } cases[] = {
        {"\"version\":\t1", "\"version\":\t2", "fsdpcheck.json", "version 2"},
        {"\"step\":\t2", "\"step\":\t7", "fsdpcheck.json", "data_position"},
        // a consistent manifest that disagrees with the files it lists
        {"\"step\":\t2,\n\t\"data_position\":\t2", "\"step\":\t7,\n\t\"data_position\":\t7",
         "optimizer.safetensors", "step 2, the manifest says 7"},
        {"\"state_dict\":\t\"full\"", "\"state_dict\":\t\"sharded\"", "fsdpcheck.json", "does not belong"},
        {"\"name\":\t\"config.json\"", "\"name\":\t\"../config.json\"", "fsdpcheck.json", "plain file name"},
        {"\"name\":\t\"model.safetensors\"", "\"name\":\t\"other.safetensors\"", "fsdpcheck.json",
         "does not belong"},
        {"\"format\":\t\"fsdpcheck-checkpoint\",", "\"format\":\t\"fsdpcheck-checkpoint\",\"step\":3,",
         "fsdpcheck.json", "twice"},
        {"\"kind\":\t\"adamw\"", "\"kind\":\t\"sgd\"", "fsdpcheck.json", "optimizer"},
        {"\"world_size\":\t1", "\"world_size\":\t0", "fsdpcheck.json", "world_size"},
        {"\"sha256\":\t\"", "\"sha256\":\t\"X", "fsdpcheck.json", "sha256"},
        {"\"bytes\":\t", "\"bytes\":\t-", "fsdpcheck.json", "bytes"},
        {"{", "[", "fsdpcheck.json", "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite_manifest(good, bad, cases[i].from, cases[i].to);
        expect_both_refuse(bad, "mlp-tiny", ARGS(cases[i].file, cases[i].want));
    }
}

Test(ckpt, swapped_files_refused) {
    // two complete checkpoints; a file of one copied into the other
    make_ckpt("a", "mlp-tiny", "full", "2", "adamw");
    make_ckpt("b", "mlp-tiny", "full", "3", "adamw");
    remove_tree(tmp_path("bad"));
    copy_dir(tmp_path("a"), tmp_path("bad"));
    size_t n;
    unsigned char *data = read_all(tmp_path("b/optimizer.safetensors"), &n);
    write_file(tmp_path("bad/optimizer.safetensors"), data, n);
    free(data);
    expect_both_refuse(tmp_path("bad"), "mlp-tiny", ARGS("optimizer.safetensors"));
}

Test(ckpt, incompatible_checkpoints_refused) {
    const char *dir = make_ckpt("ck", "gpt2-tiny", "full", "1", "adamw");
    result r;
    run_in(NULL, ARGS("run", "--quiet", "--model", "mlp-tiny", "--steps", "1", "--load", dir), &r);
    REFUSED(&r, "--load", "gpt2-tiny", "mlp-tiny");
    result_free(&r);
    run_in(NULL, ARGS("run", "--quiet", "--model", "gpt2-tiny", "--optimizer", "sgd", "--steps", "1", "--load", dir),
           &r);
    REFUSED(&r, "--load", "optimizer adamw", "sgd");
    result_free(&r);
}

// ----------------------------------------------------------------------------
// 4. misuse of the flags and subcommands

Test(ckpt, misuse_flags) {
    result r;
    struct {
        const char *args[12];
        const char *want;
    } cases[] = {
        {{"run", "--save-at", "1"}, "--save-at needs --save"},
        {{"run", "--state-dict", "full"}, "--state-dict needs --save"},
        {{"run", "--save", "x", "--save-at", "4", "--steps", "3"}, "after the last step"},
        {{"run", "--save", "x", "--save-at", "0"}, "integer"},
        {{"run", "--save", "x", "--state-dict", "half"}, "full or sharded"},
        {{"run", "--load", "x", "--init", "/dev/null"}, "--init and --load"},
        {{"ckpt"}, "inspect, verify or convert"},
        {{"ckpt", "frob", "x"}, "unknown subcommand"},
        {{"ckpt", "verify"}, "exactly one"},
        {{"ckpt", "verify", "a", "b"}, "exactly one"},
        {{"ckpt", "convert", "a"}, "SRC and DST"},
        {{"ckpt", "convert", "a", "b"}, "--to"},
        {{"ckpt", "convert", "a", "b", "--to", "half"}, "--to"},
        {{"ckpt", "convert", "a", "b", "--to", "full", "--world-size", "2"}, "--world-size applies"},
        {{"ckpt", "convert", "a", "b", "--to", "sharded", "--world-size", "0"}, "--world-size"},
        {{"ckpt", "convert", "a", "b", "--to", "sharded", "--bogus"}, "unknown flag"},
    };
    const char *work = tmp_path("work");
    cr_assert_eq(mkdir(work, 0777), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_in(work, cases[i].args, &r);
        REFUSED(&r, cases[i].want);
        expect_listing(work, "");
        result_free(&r);
    }
    // --save under a regular file: refused before any training
    write_file(tmp_path("work/F"), "x", 1);
    run_in(work, ARGS("run", "--quiet", "--save", "F/sub"), &r);
    REFUSED(&r, "--save", "F");
    expect_listing(work, "F");
    result_free(&r);
    // convert onto itself
    const char *dir = make_ckpt("ck", "mlp-tiny", "full", "1", "adamw");
    run_in(NULL, ARGS("ckpt", "convert", dir, dir, "--to", "sharded"), &r);
    REFUSED(&r, "same directory");
    result_free(&r);
    run_in(NULL, ARGS("ckpt", "verify", dir), &r);
    expect_ok(&r);
    result_free(&r);
}

// ----------------------------------------------------------------------------
// 5. convert, and the reader

Test(ckpt, convert_round_trip_is_byte_identical) {
    char full[1024], sh[1024], back[1024];  // tmp_path's buffers rotate
    snprintf(full, sizeof full, "%s", make_ckpt("full", "gpt2-tiny", "full", "2", "adamw"));
    snprintf(sh, sizeof sh, "%s", tmp_path("sharded3"));
    snprintf(back, sizeof back, "%s", tmp_path("back"));
    result r;
    run_in(NULL, ARGS("ckpt", "convert", full, sh, "--to", "sharded", "--world-size", "3"), &r);
    expect_ok(&r);
    result_free(&r);
    expect_listing(sh, "config.json fsdpcheck.json shard-00000.safetensors shard-00001.safetensors "
                       "shard-00002.safetensors");
    run_in(NULL, ARGS("ckpt", "verify", sh), &r);
    expect_ok(&r);
    result_free(&r);
    run_in(NULL, ARGS("ckpt", "convert", sh, back, "--to", "full"), &r);
    expect_ok(&r);
    result_free(&r);
    for (int i = 0; FULL_FILES[i]; i++)
        cr_expect(same_bytes(tmp_path("full/%s", FULL_FILES[i]), tmp_path("back/%s", FULL_FILES[i])),
                  "%s differs after full -> sharded -> full", FULL_FILES[i]);
    // and a run resumed from the converted checkpoint is the same run
    run_in(NULL, ARGS("run", "--quiet", "--model", "gpt2-tiny", "--steps", "1", "--load", sh, "--trace",
                      tmp_path("t1")),
           &r);
    expect_ok(&r);
    result_free(&r);
    run_in(NULL, ARGS("run", "--quiet", "--model", "gpt2-tiny", "--steps", "1", "--load", full, "--trace",
                      tmp_path("t2")),
           &r);
    expect_ok(&r);
    result_free(&r);
    cr_expect(same_bytes(tmp_path("t1/step-000002.safetensors"), tmp_path("t2/step-000002.safetensors")));
}

Test(ckpt, reader_serves_ranges_from_both_layouts) {
    const char *full = make_ckpt("full", "gpt2-tiny", "full", "2", "adamw");
    const char *sh = tmp_path("sh");
    result r;
    run_in(NULL, ARGS("ckpt", "convert", full, sh, "--to", "sharded", "--world-size", "5"), &r);
    expect_ok(&r);
    result_free(&r);
    fc_ckpt *a, *b;
    fc_error e;
    cr_assert_eq(fc_ckpt_open(full, 1, &a, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_ckpt_open(sh, 1, &b, &e), 0, "%s", e.msg);
    const fc_model *m = fc_ckpt_model(a);
    cr_expect_eq(fc_ckpt_tensor_index(a, "exp_avg_sq"), 2);
    cr_expect_eq(fc_ckpt_tensor_index(a, "momentum_buffer"), -1);
    float x[4096], y[4096];
    for (int t = 0; t < 3; t++)
        for (int p = 0; p < m->n_params; p++) {
            size_t n = m->params[p].numel, first = n / 3, cnt = n - first < 4096 ? n - first : 4096;
            uint64_t before = fc_ckpt_bytes_read(b);
            cr_assert_eq(fc_ckpt_read(a, p, t, first, cnt, x, &e), 0, "%s", e.msg);
            cr_assert_eq(fc_ckpt_read(b, p, t, first, cnt, y, &e), 0, "%s", e.msg);
            cr_expect_eq(memcmp(x, y, cnt * sizeof(float)), 0, "%s tensor %d differs between layouts",
                         m->params[p].name, t);
            cr_expect_eq(fc_ckpt_bytes_read(b) - before, cnt * sizeof(float), "a range read more than the range");
        }
    // out of range is refused
    cr_expect_neq(fc_ckpt_read(a, 0, 0, m->params[0].numel, 1, x, &e), 0);
    cr_expect_neq(fc_ckpt_read(a, m->n_params, 0, 0, 1, x, &e), 0);
    cr_expect_neq(fc_ckpt_read(a, 0, 3, 0, 1, x, &e), 0);
    fc_ckpt_close(a);
    fc_ckpt_close(b);
}

Test(ckpt, open_mem_matches_open_dir) {
    const char *dir = make_ckpt("ck", "mlp-tiny", "sharded", "2", "sgd");
    const char *names[] = {"fsdpcheck.json", "config.json", "shard-00000.safetensors"};
    fc_ckpt_mem_file files[3];
    unsigned char *bufs[3];
    for (int i = 0; i < 3; i++) {
        size_t n;
        bufs[i] = read_all(tmp_path("ck/%s", names[i]), &n);
        files[i] = (fc_ckpt_mem_file){names[i], bufs[i], n};
    }
    fc_ckpt *c;
    fc_error e;
    cr_assert_eq(fc_ckpt_open_mem(files, 3, 1, &c, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_ckpt_manifest_of(c)->step, 2);
    cr_expect_eq(fc_ckpt_manifest_of(c)->n_state, 1);
    fc_ckpt_close(c);
    // one byte of the shard changed: refused with the hash, accepted without
    bufs[2][files[2].size - 1] ^= 1;
    cr_expect_neq(fc_ckpt_open_mem(files, 3, 1, &c, &e), 0);
    cr_expect_not_null(strstr(e.msg, "shard-00000.safetensors"), "%s", e.msg);
    cr_assert_eq(fc_ckpt_open_mem(files, 2, 0, &c, &e), -1);  // the shard file left out
    cr_expect_not_null(strstr(e.msg, "missing"), "%s", e.msg);
    for (int i = 0; i < 3; i++) free(bufs[i]);
    (void)dir;
}

// ----------------------------------------------------------------------------
// PEFT's files beside a LoRA model's FULL checkpoint (core/ckpt_peft.c)

static const char *const LORA_RUN[] = {"--model", "llama-tiny", "--lora", "2:4:q_proj", NULL};

// A FULL checkpoint of llama-tiny (2 layers) with LoRA on q_proj after 2 steps.
static const char *make_lora_ckpt(const char *name) {
    const char *dir = tmp_path("%s", name);
    result r;
    run_in(NULL, ARGS("run", "--quiet", "--model", "llama-tiny", "--lora", "2:4:q_proj", "--steps", "2", "--save", dir),
           &r);
    expect_ok(&r);
    result_free(&r);
    return dir;
}

// The manifest of dir made consistent again after file `name` changed (its
// bytes and SHA-256), so that what is checked is the file's contents; with
// unlist, the file's entry removed instead.
static void edit_manifest(const char *dir, const char *name, int unlist) {
    char path[1100];
    snprintf(path, sizeof path, "%s/fsdpcheck.json", dir);
    size_t n;
    char *text = (char *)read_all(path, &n);
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    cr_assert_not_null(j);
    char fpath[1100], hex[65];
    snprintf(fpath, sizeof fpath, "%s/%s", dir, name);
    uint64_t bytes;
    fc_error e;
    cr_assert_eq(fc_sha256_file(fpath, &bytes, hex, &e), 0, "%s", e.msg);
    const cJSON *f;
    int found = 0;
    cJSON *files = cJSON_GetObjectItem(j, "files");
    int i = 0;
    cJSON_ArrayForEach(f, files) {
        if (strcmp(cJSON_GetObjectItem(f, "name")->valuestring, name) == 0) {
            found = 1;
            break;
        }
        i++;
    }
    if (found && unlist) {
        cJSON_DeleteItemFromArray(files, i);
    } else if (found) {
        cJSON_ReplaceItemInObject((cJSON *)f, "bytes", cJSON_CreateNumber((double)bytes));
        cJSON_ReplaceItemInObject((cJSON *)f, "sha256", cJSON_CreateString(hex));
    }
    cr_assert(found, "the manifest lists no %s", name);
    char *out = cJSON_Print(j);
    write_file(path, out, strlen(out));
    free(out);
    cJSON_Delete(j);
}

// `ckpt verify DIR` and `run --load DIR` of the LoRA model both refuse, naming want.
static void rehash(const char *dir, const char *name) { edit_manifest(dir, name, 0); }

static void expect_lora_refused(const char *dir, const char *const *want) {
    result r;
    run_in(NULL, ARGS("ckpt", "verify", dir), &r);
    expect_refused(&r, want);
    result_free(&r);
    const char *argv[16] = {"run", "--quiet", "--steps", "1", "--load", dir};
    int k = 6;
    for (int i = 0; LORA_RUN[i]; i++) argv[k++] = LORA_RUN[i];
    argv[k] = NULL;
    run_in(NULL, argv, &r);
    expect_refused(&r, want);
    result_free(&r);
}

Test(ckpt, lora_full_checkpoint_holds_what_peft_writes) {
    const char *dir = make_lora_ckpt("lora");
    expect_listing(dir, "adapter_config.json adapter_model.safetensors config.json fsdpcheck.json model.safetensors "
                        "optimizer.safetensors");
    // the adapters under PEFT's names, bit for bit model.safetensors' own
    fc_error e;
    fc_st_file a, m;
    cr_assert_eq(fc_st_open(tmp_path("lora/adapter_model.safetensors"), &a, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_open(tmp_path("lora/model.safetensors"), &m, &e), 0, "%s", e.msg);
    cr_expect_str_eq(fc_st_meta(&a, "format"), "pt");
    cr_expect_eq(a.n_tensors, 4, "llama-tiny's two q_proj have 4 adapters, not %d", a.n_tensors);
    for (int l = 0; l < 2; l++)
        for (int ab = 0; ab < 2; ab++) {
            char peft[128], ours[128];
            snprintf(peft, sizeof peft, "base_model.model.model.layers.%d.self_attn.q_proj.lora_%c.weight", l, "AB"[ab]);
            snprintf(ours, sizeof ours, "model.layers.%d.self_attn.q_proj.lora_%c.default.weight", l, "AB"[ab]);
            const fc_st_tensor *ta = fc_st_find(&a, peft), *tm = fc_st_find(&m, ours);
            cr_assert(ta && tm, "%s or %s missing", peft, ours);
            size_t n = (size_t)(ta->shape[0] * ta->shape[1]);
            float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
            cr_assert_eq(fc_st_read_f32(&a, ta, 0, n, x, &e), 0, "%s", e.msg);
            cr_assert_eq(fc_st_read_f32(&m, tm, 0, n, y, &e), 0, "%s", e.msg);
            cr_expect_eq(memcmp(x, y, n * sizeof(float)), 0, "%s differs from %s", peft, ours);
            free(x);
            free(y);
        }
    fc_st_close(&a);
    fc_st_close(&m);
    // LoraConfig: r, lora_alpha, the module paths adapted
    size_t n;
    char *text = (char *)read_all(tmp_path("lora/adapter_config.json"), &n);
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    cr_assert_not_null(j);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "peft_type")->valuestring, "LORA");
    cr_expect_eq(cJSON_GetObjectItem(j, "r")->valuedouble, 2);
    cr_expect_eq(cJSON_GetObjectItem(j, "lora_alpha")->valuedouble, 4);
    char *targets = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "target_modules"));
    cr_expect_str_eq(targets, "[\"model.layers.0.self_attn.q_proj\",\"model.layers.1.self_attn.q_proj\"]");
    free(targets);
    cJSON_Delete(j);
    result r;
    run_in(NULL, ARGS("ckpt", "verify", dir), &r);
    expect_ok(&r);
    result_free(&r);
}

Test(ckpt, lora_peft_files_that_disagree_are_refused) {
    char good[1024];
    snprintf(good, sizeof good, "%s", make_lora_ckpt("lora"));
    const char *bad = tmp_path("bad");
    // one adapter value changed in PEFT's file only (the last byte of the data)
    remove_tree(bad);
    copy_dir(good, bad);
    char path[1100];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", bad);
    flip_byte(path, file_size(path) - 1);
    rehash(bad, "adapter_model.safetensors");
    expect_lora_refused(bad, ARGS("adapter_model.safetensors: adapter", "differs from", "model.safetensors"));
    // a LoraConfig of another rank
    remove_tree(bad);
    copy_dir(good, bad);
    snprintf(path, sizeof path, "%s/adapter_config.json", bad);
    size_t n;
    char *text = (char *)read_all(path, &n);
    char *at = strstr(text, "\"r\":\t2");
    cr_assert_not_null(at);
    at[5] = '8';
    write_file(path, text, n);
    free(text);
    rehash(bad, "adapter_config.json");
    expect_lora_refused(bad, ARGS("adapter_config.json", "\"r\" is not 2"));
    // a LoRA checkpoint whose manifest does not list one of PEFT's files
    const char *peft[] = {"adapter_model.safetensors", "adapter_config.json"};
    for (int k = 0; k < 2; k++) {
        remove_tree(bad);
        copy_dir(good, bad);
        edit_manifest(bad, peft[k], 1);
        expect_lora_refused(bad, ARGS("fsdpcheck.json", "does not list", peft[k], "which PEFT writes"));
    }
}

Test(ckpt, peft_files_without_lora_are_refused) {
    char lora[1024], plain[1024];
    snprintf(lora, sizeof lora, "%s", make_lora_ckpt("lora"));
    snprintf(plain, sizeof plain, "%s", make_ckpt("plain", "mlp-tiny", "full", "2", "adamw"));
    // each of PEFT's files copied into a checkpoint of a model without LoRA, and listed
    const char *peft[] = {"adapter_model.safetensors", "adapter_config.json"};
    const char *bad = tmp_path("bad");
    for (int k = 0; k < 2; k++) {
        remove_tree(bad);
        copy_dir(plain, bad);
        char src[1100], dst[1100];
        snprintf(src, sizeof src, "%s/%s", lora, peft[k]);
        snprintf(dst, sizeof dst, "%s/%s", bad, peft[k]);
        size_t n;
        unsigned char *data = read_all(src, &n);
        write_file(dst, data, n);
        free(data);
        // listed as the manifest's last file, with its true size and hash
        snprintf(src, sizeof src, "%s/fsdpcheck.json", bad);
        char *text = (char *)read_all(src, &n);
        cJSON *j = cJSON_ParseWithLength(text, n);
        free(text);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", peft[k]);
        cJSON_AddNumberToObject(f, "bytes", 0);
        cJSON_AddStringToObject(f, "sha256", "");
        cJSON_AddItemToArray(cJSON_GetObjectItem(j, "files"), f);
        char *out = cJSON_Print(j);
        write_file(src, out, strlen(out));
        free(out);
        cJSON_Delete(j);
        rehash(bad, peft[k]);
        result r;
        run_in(NULL, ARGS("ckpt", "verify", bad), &r);
        REFUSED(&r, peft[k], "model mlp-tiny has no LoRA");
        result_free(&r);
    }
}
