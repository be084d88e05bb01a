// tests/unit/test_cli_compare.c — `fsdpcheck compare DIR_A DIR_B`, run as a user
// runs it, on traces written by `fsdpcheck run` (and `mpiexec -n 2 fsdpcheck
// run`, spawned with fork/exec: this process never calls MPI).
//
//  - the same config twice: exit 0, every kind of every step "pass";
//  - a different --seed: exit 1, the first divergence is the batch (step,
//    tensor, element, both values, the rank reading that sample);
//  - a different --lr: data, loss and gradients of step 0 agree, the first
//    divergence is param.layers.0.weight [0, 0];
//  - W = 2 full_shard against local: within the fp32 tolerance, not bitwise;
//    an element patched in B's step file is reported with the rank that owns it
//    under B's layout (full_shard, hybrid_shard);
//  - --rtol/--atol overrides, --report FILE.md;
//  - bad input: exit 2, exactly one "fsdpcheck: " line on stderr naming the
//    problem, nothing on stdout: missing directory, no trace.json, a missing,
//    truncated or stray step file, a missing, extra or mis-shaped tensor, a
//    corrupt trace.json, different models, no common step, bad flags.
#include <criterion/criterion.h>

#include <cJSON.h>
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#define RUN_TIMEOUT_S 120  // a hung child cannot hang the suite
#include "cli_harness.h"

// ----------------------------------------------------------------------------
// running fsdpcheck (and mpiexec)

// Plain text of a file, at most cap - 1 bytes, "" if it cannot be read.
static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
}

static result R;  // the last command's result

// Runs argv (argv[0] is run through PATH (mpiexec) or is a path (the
// binary)) into R; a child killed by a signal fails the test.
static int spawn(const char *const *argv) {
    result_free(&R);
    run_argv(NULL, argv, &R);
    cr_assert_eq(R.signal, 0, "%s killed by signal %d; stderr:\n%s", R.cmd, R.signal, R.err);
    return R.code;
}

// fsdpcheck with args (NULL-terminated).
static int fsdpcheck(const char *const *args) {
    const char *argv[48];
    int n = 0;
    argv[n++] = binary();
    for (; args[n - 1]; n++) {
        cr_assert_lt(n, 47);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    return spawn(argv);
}

// `fsdpcheck run --quiet --trace DIR/name` with extra flags (local, W = 1).
// A trace directory's path, kept apart from tmp_path()'s buffers (which rotate).
static const char *trace_dir(const char *name) {
    static char dirs[4][512];
    static int next;
    char *d = dirs[next++ % 4];
    snprintf(d, 512, "%s/%s", g_tmp, name);
    return d;
}

static const char *trace(const char *name, const char *const *extra) {
    const char *dir = trace_dir(name);
    const char *args[40] = {"run", "--quiet", "--trace", dir};
    int n = 4;
    for (int i = 0; extra && extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    cr_assert_eq(fsdpcheck(args), 0, "run %s failed:\n%s", name, R.err);
    return dir;
}

// The same under `mpiexec -n 2` (FC_MPIEXEC overrides the launcher's name).
static const char *trace_w2(const char *name, const char *const *extra) {
    const char *dir = trace_dir(name);
    const char *mpiexec = getenv("FC_MPIEXEC");
    const char *argv[48] = {mpiexec && *mpiexec ? mpiexec : "mpiexec", "-n", "2", binary(), "run", "--quiet", "--trace", dir};
    int n = 8;
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    spawn(argv);
    cr_assert_eq(R.code, 0, "mpiexec -n 2 run %s failed (%d):\n%s", name, R.code, R.err);
    return dir;
}

static void setup(void) {
    // MPI singleton/hydra start under ASan: hwloc's PCI discovery leaks and
    // LeakSanitizer would fail the child; the MPI tests set the same in ctest
    setenv("HWLOC_COMPONENTS", "-pci,-x86", 1);
    tmp_setup("fc_test_cmp");
}

TestSuite(compare, .init = setup, .fini = tmp_teardown, .timeout = 240);

static void expect_out(const char *frag) {
    cr_expect_not_null(strstr(R.out, frag), "stdout lacks '%s':\n%s", frag, R.out);
}

// A row of the per-step table: some stdout line whose whitespace-separated
// fields start with want's ("0 lock 0 grad 6 0 0 0 0 0 pass"), whatever the
// column widths.
static void squeeze(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    int space = 1;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        if (s[i] == ' ' || s[i] == '\t') {
            if (!space) out[k++] = ' ';
            space = 1;
        } else {
            out[k++] = s[i];
            space = 0;
        }
    }
    out[k] = '\0';
}

// Whether the squeezed line got starts with the squeezed tokens of want,
// where a want token "*" stands for any one token (a value the test does not fix).
static int row_matches(const char *got, const char *want) {
    while (*want) {
        if (want[0] == '*' && (want[1] == ' ' || !want[1])) {
            want++;
            while (*got && *got != ' ') got++;
        } else {
            while (*want && *want != ' ') {
                if (*got++ != *want++) return 0;
            }
            if (*got && *got != ' ' && !*want) return 0;
        }
        if (!*want) return 1;
        if (*got++ != ' ') return 0;
        want++;
    }
    return 1;
}

static void expect_row(const char *want) {
    char w[512];
    squeeze(want, strlen(want), w, sizeof w);
    for (const char *l = R.out; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        char got[512];
        squeeze(l, n, got, sizeof got);
        // the table's rows are indented: compare from the first token
        if (row_matches(got[0] == ' ' ? got + 1 : got, w)) return;
        l += n + (e ? 1 : 0);
    }
    cr_expect_fail("no row '%s' in stdout:\n%s", w, R.out);
}

// exit 2, nothing on stdout, one "fsdpcheck: " line on stderr holding frag.
static void expect_usage(const char *frag) {
    cr_expect_eq(R.code, 2, "exit %d, want 2; stdout:\n%s\nstderr:\n%s", R.code, R.out, R.err);
    cr_expect_eq(R.out[0], '\0', "printed on stdout:\n%s", R.out);
    size_t len = strlen(R.err);
    cr_expect(len > 0 && R.err[len - 1] == '\n' && strchr(R.err, '\n') == R.err + len - 1,
              "stderr is not exactly one line:\n%s", R.err);
    cr_expect_eq(strncmp(R.err, "fsdpcheck: ", 11), 0, "stderr: %s", R.err);
    cr_expect_not_null(strstr(R.err, frag), "stderr lacks '%s': %s", frag, R.err);
}

// ----------------------------------------------------------------------------
// step-file surgery, with core's reader and writer

typedef struct {
    const char *drop;     // a tensor to leave out
    const char *add;      // a tensor to add (F32 [1])
    const char *reshape;  // a 2-D tensor to transpose
    long step;            // the step written into the metadata
    const char *scale[2]; // F32 tensors to tamper with: multiplied by factor,
    long long index;      // element `index` only, or every element when index < 0
    double factor;
} edit;

static void rewrite_step(const char *in, const char *out, const edit *ed) {
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(in, &f, &e), 0, "%s", e.msg);
    fc_st_entry *ent = calloc((size_t)f.n_tensors + 1, sizeof *ent);
    void **data = calloc((size_t)f.n_tensors + 1, sizeof *data);
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const fc_st_tensor *t = &f.tensors[i];
        if (ed->drop && !strcmp(t->name, ed->drop)) continue;
        data[n] = malloc(t->end - t->begin + 1);
        cr_assert_eq(fc_st_read(&f, t, 0, t->numel, data[n], &e), 0, "%s", e.msg);
        for (int k = 0; k < 2; k++) {
            if (!ed->scale[k] || strcmp(t->name, ed->scale[k])) continue;
            cr_assert_eq(t->dtype, FC_DT_F32, "%s is not F32", t->name);
            cr_assert_lt(ed->index, (long long)t->numel);
            float *v = data[n];
            for (uint64_t i = 0; i < t->numel; i++)
                if (ed->index < 0 || (uint64_t)ed->index == i) v[i] = (float)(v[i] * ed->factor);
        }
        ent[n] = (fc_st_entry){t->name, t->dtype, t->ndim, {0}, data[n]};
        for (int d = 0; d < t->ndim; d++) ent[n].shape[d] = t->shape[d];
        if (ed->reshape && !strcmp(t->name, ed->reshape)) {
            cr_assert_eq(t->ndim, 2);
            ent[n].shape[0] = t->shape[1];
            ent[n].shape[1] = t->shape[0];
        }
        n++;
    }
    static const float one = 1.0f;
    if (ed->add) ent[n++] = (fc_st_entry){ed->add, FC_DT_F32, 1, {1}, &one};
    char step[32];
    snprintf(step, sizeof step, "%ld", ed->step);
    fc_st_meta_kv meta[] = {{"format", "fsdpcheck-trace"}, {"step", step}};
    cr_assert_eq(fc_st_write(out, ent, n, meta, 2, &e), 0, "%s", e.msg);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(ent);
    fc_st_close(&f);
}

// Overwrites element `index` of tensor `name` in a step file with `value`.
static void patch_element(const char *file, const char *name, uint64_t index, float value) {
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(file, &f, &e), 0, "%s", e.msg);
    const fc_st_tensor *t = fc_st_find(&f, name);
    cr_assert_not_null(t, "no tensor %s in %s", name, file);
    cr_assert_eq(t->dtype, FC_DT_F32);
    cr_assert_lt(index, t->numel);
    long off = (long)(f.data_start + t->begin + index * 4);
    fc_st_close(&f);
    FILE *fp = fopen(file, "r+b");
    cr_assert_not_null(fp);
    cr_assert_eq(fseek(fp, off, SEEK_SET), 0);
    cr_assert_eq(fwrite(&value, 4, 1, fp), 1);  // little-endian, as the trace
    cr_assert_eq(fclose(fp), 0);
}

// Edits trace.json: sets an integer field.
static void set_trace_field(const char *dir, const char *key, double value) {
    char p[600], buf[65536];
    snprintf(p, sizeof p, "%s/trace.json", dir);
    slurp(p, buf, sizeof buf);
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j);
    cJSON_ReplaceItemInObject(j, key, cJSON_CreateNumber(value));
    char *text = cJSON_Print(j);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    free(text);
    cJSON_Delete(j);
}

// ----------------------------------------------------------------------------
// pass and fail

Test(compare, the_same_config_twice_passes) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 0, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    cr_expect_eq(R.err[0], '\0', "stderr: %s", R.err);
    expect_out("comparing steps 0..2");
    expect_out("policy: fp32");
    expect_out("policy: fp32 (A is expected; per element |A - B| <= atol + rtol * scale");
    expect_row("2 lock 0 optim 12 0 0 0 0 0 pass");
    expect_row("0 lock 0 batch 2 0 0 0 0 - pass");
    expect_out("PASS: 3 steps agree within the policy");
    cr_expect_null(strstr(R.out, "FAIL"), "%s", R.out);
    cr_expect_eq(fsdpcheck(ARGS("compare", "--bitwise", a, b)), 0, "the same run is bitwise the same (P12):\n%s", R.out);
}

// --trace-tensors first: the later step files hold loss, norm and batch only,
// trace.json says so, and compare judges such a trace in lockstep with the
// same rows as the whole one (its later steps are re-runs); --trajectory, and
// the trace as B, are refused with one line
Test(compare, a_trace_with_the_first_steps_tensors_only) {
    const char *a = trace("a", ARGS("--trace-tensors", "first")), *full = trace("full", NULL);
    const char *b = trace("b", ARGS("--lr", "0.0011"));
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(tmp_path("a/step-000002.safetensors"), &f, &e), 0, "%s", e.msg);
    cr_expect(fc_st_find(&f, "batch.input") && fc_st_find(&f, "loss") && !fc_st_find(&f, "grad.layers.0.weight"),
              "a later step file holds a tensor set, or lacks its batch");
    fc_st_close(&f);
    cJSON *j = load_json(tmp_path("a/trace.json"));
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "tensor_steps");
    cr_expect(cJSON_IsNumber(ts) && ts->valuedouble == 1, "trace.json: tensor_steps is not 1");
    cJSON_Delete(j);
    int ca = fsdpcheck(ARGS("compare", a, b));
    char *rows_a = strdup(strstr(R.out, "steps judged") ? strstr(R.out, "steps judged") : "");
    int cf = fsdpcheck(ARGS("compare", full, b));
    const char *rows_f = strstr(R.out, "steps judged") ? strstr(R.out, "steps judged") : "";
    cr_expect(ca == 1 && cf == 1, "compare: exit %d with the first step's tensors, %d with all (the lr differs)", ca, cf);
    cr_expect(rows_a[0] && !strcmp(rows_a, rows_f), "the rows differ:\n%s\n---\n%s", rows_a, rows_f);
    free(rows_a);
    fsdpcheck(ARGS("compare", a, b, "--trajectory"));
    expect_usage("compare it in lockstep");
    fsdpcheck(ARGS("compare", b, a));
    expect_usage("the trace under test (B) records every step");
    fsdpcheck(ARGS("run", "--trace-tensors", "first"));
    expect_usage("--trace-tensors needs --trace DIR");
}

Test(compare, a_different_seed_diverges_at_the_data) {
    const char *a = trace("a", NULL), *b = trace("b", ARGS("--seed", "99"));
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    cr_expect_eq(R.err[0], '\0', "a mismatch is not an error: %s", R.err);
    expect_out("first divergence: step 0, tensor batch.input, element 0 [0, 0] of shape [8, 13]\n");
    expect_out("  A = ");
    expect_out("  B = ");
    expect_out("allowed: exact");
    expect_out("owner under B's layout: rank 0 (reads sample 0 of the global batch");
    expect_out("note: the runs trained on different data");
    expect_out("FAIL: 3 of 3 steps differ");
}

Test(compare, a_different_lr_diverges_at_the_first_update) {
    const char *a = trace("a", NULL), *b = trace("b", ARGS("--lr", "0.002"));
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_row("0 lock 0 batch 2 0 0 0 0 - pass");
    expect_row("0 lock 0 loss 1 0 0 0 0 0 pass");
    expect_row("0 lock 0 grad 6 0 0 0 0 0 pass");
    expect_row("0 lock 0 param 6");
    expect_out("FAIL (6 of 6 tensors)");
    expect_out("first divergence: step 0, tensor param.layers.0.weight, element 0 [0, 0] of shape [17, 13]\n");
    expect_out("owner under B's layout: every rank (replicated: local holds full parameters on all 1 rank;");
    // a wide enough override accepts it
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b, "--atol", "1")), 0, "%s", R.out);
    expect_out("policy: --rtol/--atol override");
}

// fsdpcheck sensitivity: the smallest perturbation of B the engine catches,
// per kind, on a pair that legitimately differs (local against full_shard W=2).
Test(compare, sensitivity_finds_the_smallest_delta_caught) {
    const char *a = trace("local", NULL), *b = trace_w2("fs2", ARGS("--strategy", "full_shard"));
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", a, b)), 0, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("step 0, lockstep row (fp32), model mlp-tiny (520 parameters)");
    expect_out("the smallest delta caught");
    expect_out("grad   grad.layers.0.weight");
    expect_out("param  param.layers.0.weight");
    expect_out("optim  optim.exp_avg.layers.0.weight");
    expect_out("optim  optim.exp_avg_sq.layers.0.weight");
    expect_out("lr at the largest");
    // a grad delta near the fp32 rtol (3.6e-5): caught above it, within the 1.26x resolution
    const char *g = strstr(R.out, "\ngrad ");
    cr_assert_not_null(g, "%s", R.out);
    double elem = 0;
    char name[128];
    cr_assert_eq(sscanf(g + 1, "grad %127s %*d %lf", name, &elem), 2, "%s", g);
    cr_expect(elem >= 3.6e-5 && elem <= 3.6e-5 * 1.3, "grad one-element delta %g", elem);
    // step 1 in lockstep: A re-run from B's state, as sharp as step 0
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", "--step", "1", a, b)), 0, "%s", R.err);
    expect_out("step 1 (A re-run from B's state), lockstep row (fp32)");
    g = strstr(R.out, "\ngrad ");
    cr_assert_not_null(g, "%s", R.out);
    cr_assert_eq(sscanf(g + 1, "grad %127s %*d %lf", name, &elem), 2, "%s", g);
    cr_expect(elem >= 3.6e-5 && elem <= 3.6e-5 * 1.3, "step 1 grad one-element delta %g", elem);
    // along the recorded trajectories: no re-run
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", "--step", "1", "--trajectory", a, b)), 0, "%s", R.err);
    cr_expect_null(strstr(R.out, "re-run"), "%s", R.out);
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", "--step", "1", "--same-compute", a, b)), 0, "%s", R.err);
    expect_out("step 1");
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", "--step", "9", a, b)), 2);
    expect_usage("sensitivity --step 9: not in both traces");
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", a)), 2);
    expect_usage("sensitivity needs two trace directories");
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", "--bogus", a, b)), 2);
    expect_usage("sensitivity: unknown flag --bogus");
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", a, b, "--threads")), 2);
    expect_usage("sensitivity: --threads needs a value");
}

// sensitivity with frozen parameters: each kind measured on its largest
// trainable tensor (a frozen one's zero gradient and state have no relative
// delta), and the frozen tensors named as judged exactly, by --freeze or LoRA.
Test(compare, sensitivity_of_frozen_and_lora_runs) {
    const char *a = trace("frz_local", ARGS("--freeze", "layers[.]1")),
               *b = trace_w2("frz_fs2", ARGS("--strategy", "full_shard", "--freeze", "layers[.]1"));
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", a, b)), 0, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("grad   grad.layers.0.weight");
    expect_out("frozen: 2 parameter tensors (--freeze 'layers[.]1'): value, gradient and optimizer state judged "
               "exactly, any change fails");
    a = trace("lora_local", ARGS("--model", "llama-micro", "--lora", "2:4:q_proj"));
    b = trace_w2("lora_fs2", ARGS("--model", "llama-micro", "--lora", "2:4:q_proj", "--strategy", "full_shard"));
    cr_expect_eq(fsdpcheck(ARGS("sensitivity", a, b)), 0, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("grad   grad.model.layers.0.self_attn.q_proj.lora_");
    expect_out("frozen: 11 parameter tensors (LoRA's base): value, gradient");
}

Test(compare, w2_full_shard_is_close_to_local_but_not_bitwise) {
    const char *a = trace("local", NULL), *b = trace_w2("fs2", ARGS("--strategy", "full_shard"));
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 0, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("B: ");
    expect_out("full_shard, W=2");
    expect_out("PASS");
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b, "--bitwise")), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("policy: --bitwise");
    expect_out("first divergence: step ");
    expect_out("allowed: exact");
    expect_out("owner under B's layout: ");
    // zero tolerance is not bitwise, but fails too: the values differ
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b, "--rtol", "0", "--atol", "0")), 1, "%s", R.out);
}

Test(compare, the_owner_of_a_patched_element_under_full_shard) {
    const char *a = trace("local", NULL), *b = trace_w2("fs2", ARGS("--strategy", "full_shard"));
    // layers.0.bias[16] is element 237 of unit layers.0 (238 elements): shard 1 of 2
    patch_element(tmp_path("fs2/step-000001.safetensors"), "param.layers.0.bias", 16, 1000.0f);
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("first divergence: step 1, tensor param.layers.0.bias, element 16 [16] of shape [17]\n");
    expect_out("  B = 1000 (0x447a0000)\n");
    expect_out("owner under B's layout: rank 1 (full_shard shard 1 of 2; unit layers.0, element 237 of 238, shard size 119)");
    expect_row("1 lock * param 6");
    expect_out("FAIL (1 of 6 tensors)");
    // in lockstep step 2 is re-run from B's recorded (patched) step 1, which B's
    // own step 2 never started from: it fails too
    expect_out("FAIL: 2 of 3 steps differ");
    // the other way round, B is local: every rank holds it (A's own patched
    // step is read only along its trajectory: lockstep re-runs A's steps)
    cr_expect_eq(fsdpcheck(ARGS("compare", "--trajectory", b, a)), 1, "%s", R.out);
    expect_out("owner under B's layout: every rank (replicated: local");
}

Test(compare, the_owner_under_hybrid_shard) {
    const char *a = trace("local", NULL),
               *b = trace_w2("hs", ARGS("--strategy", "hybrid_shard", "--shard-group", "1"));
    patch_element(tmp_path("hs/step-000000.safetensors"), "grad.layers.2.weight", 3 * 11 + 4, -7.0f);
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("first divergence: step 0, tensor grad.layers.2.weight, element 37 [3, 4] of shape [7, 11]\n");
    expect_out("owner under B's layout: rank 0 (hybrid_shard shard 0 of 1 of shard group 0, replicated on rank 1; "
               "unit layers.2, element 37 of 84, shard size 84)");
}

Test(compare, report_file) {
    const char *a = trace("a", NULL), *b = trace("b", ARGS("--lr", "0.002"));
    const char *rep = tmp_path("report.md");
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b, "--report", rep)), 1, "%s", R.err);
    expect_out("report written to ");
    char md[65536];
    slurp(rep, md, sizeof md);
    const char *want[] = {"# fsdpcheck compare\n", "**Result: FAIL**", "| strategy | local | local |",
                          "## Tolerance policy (fp32)", "| kind | lockstep (fp32) | diverged (fp32) |",
                          "| batch | exact | exact |", "| grad | rtol 3.6e-05 ntol 1.5e-05 | rtol 3.6e-05 ntol 1.5e-05, each + 5.7 x prev dP |",
                          "## First divergence", "tensor param.layers.0.weight", "of the tensor's scale", "## Per step",
                          "| step | kind | tensors | max abs err | max err/scale | ULP at scale | norm ratio | of tolerance |",
                          "| 0 | grad | 6 | 0 | 0 | 0 | 0 | 0 | lockstep | pass |", "| 0 | param | 6 |", "**FAIL**",
                          "## Per tensor", "| 2 | optim.exp_avg_sq.layers.2.bias | 7 |"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_not_null(strstr(md, want[i]), "report lacks '%s':\n%s", want[i], md);
    // the report of a pass says so
    cr_expect_eq(fsdpcheck(ARGS("compare", a, a, "--report", rep)), 0, "%s", R.err);
    slurp(rep, md, sizeof md);
    cr_expect_not_null(strstr(md, "**Result: PASS**"), "%s", md);
    // an unwritable report is a usage error
    cr_expect_eq(fsdpcheck(ARGS("compare", a, a, "--report", "/nonexistent/dir/r.md")), 2);
    cr_expect_not_null(strstr(R.err, "--report /nonexistent/dir/r.md"), "%s", R.err);
}

Test(compare, only_common_steps_are_compared) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    // B becomes steps 1..3: its files renamed (and their metadata rewritten) one up
    for (int s = 2; s >= 0; s--) {
        edit ed = {.step = s + 1};
        rewrite_step(tmp_path("b/step-%06d.safetensors", s), tmp_path("b/step-%06d.safetensors", s + 1), &ed);
    }
    cr_assert_eq(unlink(tmp_path("b/step-000000.safetensors")), 0);
    set_trace_field(b, "first_step", 1);
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("comparing steps 1..2");
    cr_expect_null(strstr(R.out, "\n     0  "), "step 0 is not in B:\n%s", R.out);
    // no step in common (B starts right after A ends): bad input
    for (int s = 3; s >= 1; s--) {
        edit ed = {.step = s + 2};
        rewrite_step(tmp_path("b/step-%06d.safetensors", s), tmp_path("b/step-%06d.safetensors", s + 2), &ed);
    }
    for (int s = 1; s <= 2; s++) cr_assert_eq(unlink(tmp_path("b/step-%06d.safetensors", s)), 0);
    set_trace_field(b, "first_step", 3);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("no step in common");
}

// ----------------------------------------------------------------------------
// tampered traces: an error a fixed absolute tolerance lets through is caught
// against the tensor's scale, and the noise of another W is not

// Copies the files of trace directory src into a new directory dst.
static void copy_trace(const char *src, const char *dst) {
    make_dir(dst);
    DIR *d = opendir(src);
    cr_assert_not_null(d, "cannot open %s", src);
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", src, ent->d_name);
        snprintf(b, sizeof b, "%s/%s", dst, ent->d_name);
        size_t n;
        unsigned char *data = read_all(a, &n);
        write_file(b, data, n);
        free(data);
    }
    closedir(d);
}

// The two tamperings of step 1: one gradient element times 1.01, and both
// blocks' ln_1.weight gradients, every element, times 1.05.
#define ONE_ELEMENT {.step = 1, .scale = {"grad.transformer.h.1.mlp.c_fc.bias", NULL}, .index = 7, .factor = 1.01}
#define TWO_TENSORS                                                                                             \
    {.step = 1, .scale = {"grad.transformer.h.0.ln_1.weight", "grad.transformer.h.1.ln_1.weight"}, .index = -1, \
     .factor = 1.05}

// Prints the first divergence's lines up to its owner (for the test log).
static void show_divergence(const char *what) {
    const char *d = strstr(R.out, "first divergence:"), *o = d ? strstr(d, "  owner") : NULL;
    if (d) printf("%s:\n%.*s", what, (int)(o ? o - d : (ptrdiff_t)strlen(d)), d);
}

// A copy of the trace orig with step 1 tampered by ed.
static const char *tampered(const char *orig, const char *name, const edit *ed) {
    const char *dir = trace_dir(name);
    copy_trace(orig, dir);
    char step1[1100];
    snprintf(step1, sizeof step1, "%s/step-000001.safetensors", dir);
    rewrite_step(step1, step1, ed);
    return dir;
}

Test(compare, one_gradient_element_off_by_one_percent_is_caught) {
    const char *a = trace_w2("fs2", ARGS("--model", "gpt2-tiny", "--strategy", "full_shard"));
    edit ed = ONE_ELEMENT;
    const char *b = tampered(a, "tampered", &ed);
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    cr_expect_eq(R.err[0], '\0', "%s", R.err);
    expect_out("first divergence: step 1, tensor grad.transformer.h.1.mlp.c_fc.bias, element 7 [7] of shape [64]\n");
    expect_out("of the tensor's scale");
    expect_out("owner under B's layout: rank ");
    expect_out("FAIL (1 of 28 tensors)");
    expect_out("FAIL: 1 of 3 steps differ");
    cr_expect_null(strstr(R.out, "its largest error"), "one element, not the tensor as a whole:\n%s", R.out);
    show_divergence("tampered (i): grad.transformer.h.1.mlp.c_fc.bias[7] x 1.01");
}

Test(compare, two_whole_layer_norm_gradients_off_by_five_percent_are_caught) {
    const char *a = trace_w2("fs2", ARGS("--model", "gpt2-tiny", "--strategy", "full_shard"));
    edit ed = TWO_TENSORS;
    const char *b = tampered(a, "tampered", &ed);
    cr_expect_eq(fsdpcheck(ARGS("compare", a, b)), 1, "stdout:\n%s\nstderr:\n%s", R.out, R.err);
    expect_out("first divergence: step 1, tensor grad.transformer.h.0.ln_1.weight, element ");
    expect_out("of shape [16]\n");
    expect_out("FAIL (2 of 28 tensors)");
    expect_out("FAIL: 1 of 3 steps differ");
    show_divergence("tampered (ii): grad.transformer.h.{0,1}.ln_1.weight x 1.05");
}

Test(compare, the_noise_of_another_world_size_passes_and_the_tampering_does_not) {
    const char *l = trace("local", ARGS("--model", "gpt2-tiny"));
    const char *a = trace_w2("fs2", ARGS("--model", "gpt2-tiny", "--strategy", "full_shard"));
    cr_expect_eq(fsdpcheck(ARGS("compare", l, a)), 0, "legitimate noise (local vs W=2 full_shard):\n%s\n%s", R.out,
                 R.err);
    expect_out("PASS: 3 steps agree within the policy");
    edit one = ONE_ELEMENT;
    const char *b = tampered(a, "tampered1", &one);
    cr_expect_eq(fsdpcheck(ARGS("compare", l, b)), 1, "%s", R.out);
    expect_out("first divergence: step 1, tensor grad.transformer.h.1.mlp.c_fc.bias, element 7 [7] of shape [64]\n");
    edit two = TWO_TENSORS;
    b = tampered(a, "tampered2", &two);
    cr_expect_eq(fsdpcheck(ARGS("compare", l, b)), 1, "%s", R.out);
    expect_out("first divergence: step 1, tensor grad.transformer.h.0.ln_1.weight, element ");
}

// ----------------------------------------------------------------------------
// bad input

Test(compare, missing_directory_and_not_a_trace) {
    const char *a = trace("a", NULL);
    fsdpcheck(ARGS("compare", a, tmp_path("nonexistent")));
    expect_usage("cannot open trace directory");
    fsdpcheck(ARGS("compare", tmp_path("a/trace.json"), a));
    expect_usage("not a directory");
    mkdir(tmp_path("empty"), 0755);
    fsdpcheck(ARGS("compare", a, tmp_path("empty")));
    expect_usage("no trace.json");
}

Test(compare, incomplete_traces) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    cr_assert_eq(unlink(tmp_path("b/step-000001.safetensors")), 0);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("step-000001.safetensors: missing");
    cr_assert_eq(unlink(tmp_path("b/trace.json")), 0);  // the run died before it finished
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("no trace.json (an incomplete trace");
    cr_assert_eq(unlink(tmp_path("a/init.safetensors")), 0);
    fsdpcheck(ARGS("compare", a, a));
    expect_usage("init.safetensors: missing");
}

Test(compare, corrupt_files) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    cr_assert_eq(truncate(tmp_path("b/step-000002.safetensors"), 1000), 0);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("step-000002.safetensors");
    FILE *f = fopen(tmp_path("a/trace.json"), "w");
    fputs("{\"format\": \"fsdpcheck-trace\", ", f);
    fclose(f);
    fsdpcheck(ARGS("compare", a, a));
    expect_usage("not valid JSON");
}

Test(compare, trace_json_fields_are_validated) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    set_trace_field(b, "version", 2);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("trace format version 2");
    set_trace_field(b, "version", 1);
    set_trace_field(b, "steps", 5);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("step-000003.safetensors: missing");
    set_trace_field(b, "steps", 2);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("step-000002.safetensors: not one of the steps 0..1");
    set_trace_field(b, "steps", 3);
    set_trace_field(b, "world_size", 3);  // a local run is one process
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("runs as one process, not 3");
    set_trace_field(b, "world_size", 1);
    set_trace_field(b, "first_step", -1);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("\"first_step\" must be an integer in 0..");
}

Test(compare, tensors_must_match_the_registry) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    const char *s1 = tmp_path("b/step-000001.safetensors");
    edit drop = {.drop = "grad.layers.1.bias", .step = 1};
    rewrite_step(s1, s1, &drop);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("missing tensor \"grad.layers.1.bias\"");

    b = trace("b", NULL);
    edit add = {.add = "grad.layers.9.weight", .step = 1};
    rewrite_step(s1, s1, &add);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("unexpected tensor \"grad.layers.9.weight\"");

    b = trace("b", NULL);
    edit shape = {.reshape = "optim.exp_avg.layers.0.weight", .step = 1};
    rewrite_step(s1, s1, &shape);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("tensor \"optim.exp_avg.layers.0.weight\" has shape [13, 17], expected [17, 13]");

    b = trace("b", NULL);
    edit meta = {.step = 7};
    rewrite_step(s1, s1, &meta);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("metadata says step \"7\"");
}

// A clipping run's trace carries the total norm clip_grad_norm_ returned, as
// F64 "grad_norm" in every step file, and compare judges it; without it (or
// as another dtype) the trace is refused. A run that does not clip may carry
// it (the reference always does).
Test(compare, a_clipping_trace_carries_the_norm) {
    const char *clip[] = {"--clip-grad-norm", "0.05", NULL};
    const char *a = trace("a", clip), *b = trace("b", clip);
    fsdpcheck(ARGS("compare", a, b));
    cr_expect_eq(R.code, 0, "%s%s", R.out, R.err);
    expect_row("0 lock 0 norm 1 0 0 0 0 0 pass");
    const char *s1 = tmp_path("b/step-000001.safetensors");
    edit drop = {.drop = "grad_norm", .step = 1};
    rewrite_step(s1, s1, &drop);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("step-000001.safetensors: missing tensor \"grad_norm\" (the config clips");

    b = trace("b", clip);
    rewrite_step(s1, s1, &drop);
    edit f32 = {.add = "grad_norm", .step = 1};  // F32 [1]
    rewrite_step(s1, s1, &f32);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("tensor \"grad_norm\" is F32, expected F64");

    // no clipping: the norm is optional, and judged when both sides have it
    a = trace("a", NULL), b = trace("b", NULL);
    rewrite_step(s1, s1, &drop);
    fsdpcheck(ARGS("compare", a, b));
    cr_expect_eq(R.code, 0, "%s%s", R.out, R.err);
    expect_row("0 lock 0 norm 1 0 0 0 0 0 pass");
}

Test(compare, a_stray_step_file) {
    const char *a = trace("a", NULL), *b = trace("b", NULL);
    edit ed = {.step = 5};
    rewrite_step(tmp_path("b/step-000002.safetensors"), tmp_path("b/step-000005.safetensors"), &ed);
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("step-000005.safetensors: not one of the steps 0..2");
}

Test(compare, different_models) {
    const char *a = trace("a", NULL), *b = trace("b", ARGS("--model", "gpt2-tiny", "--steps", "1"));
    fsdpcheck(ARGS("compare", a, b));
    expect_usage("trained different models");
}

Test(compare, bad_flags) {
    const char *a = trace("a", NULL);
    fsdpcheck(ARGS("compare", a));
    expect_usage("two trace directories");
    fsdpcheck(ARGS("compare", a, a, a));
    expect_usage("unexpected argument");
    fsdpcheck(ARGS("compare", a, a, "--bitwise", "--rtol", "1e-3"));
    expect_usage("exclude each other");
    fsdpcheck(ARGS("compare", a, a, "--rtol", "-1"));
    expect_usage("--rtol");
    fsdpcheck(ARGS("compare", a, a, "--atol", "nan"));
    expect_usage("finite");
    fsdpcheck(ARGS("compare", a, a, "--atol"));
    expect_usage("needs a value");
    fsdpcheck(ARGS("compare", a, a, "--tolerance", "1"));
    expect_usage("unknown flag --tolerance");
    fsdpcheck(ARGS("compare", a, a, "--bitwise=1"));
    expect_usage("takes no value");
    cr_expect_eq(fsdpcheck(ARGS("compare", "--help")), 0);
    expect_out("usage: fsdpcheck compare DIR_A DIR_B");
}
