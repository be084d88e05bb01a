// tests/unit/test_trace_view.c — tracefile's views (oracle/tracefile.h).
//
// A step file fsdpcheck's writer (oracle/trace.c) lays out holds each set
// whole, in registry order: fc_trace_view_step maps it and points into the
// mapping, owning no copy. A file whose tensors lie in another order (the
// safetensors package sorts them by name) is read into memory of the view's
// own. Both give exactly the sets written, as fc_trace_read_step does; so
// does init. The sets are crafted so that every element is distinct: a view
// off by one element or one tensor cannot pass.
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "trace.h"
#include "tracefile.h"

#include "cli_harness.h"  // tmp_setup, tmp_path, tmp_teardown

static fc_run_config cfg_of(void) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_error e;
    cr_assert_eq(fc_model_config_load("gpt2-tiny", &c.model, &e), 0, "%s", e.msg);
    c.strategy = FC_STRATEGY_LOCAL;
    c.global_batch = 2;
    c.seq_len = 4;
    c.steps = 1;
    cr_assert_eq(fc_run_config_validate(&c, &e), 0, "%s", e.msg);
    return c;
}

// set k's element i: distinct across sets and elements, exact in float
static float value(int k, size_t i) { return (float)(k * 1000003 + (long)i) * 0.25f; }

// Writes a one-step trace of cfg into dir: init (set 9) and step 0 (sets 0..3).
static void write_trace(const char *dir, const fc_run_config *c, const fc_model *m) {
    size_t n = m->numel;
    float *sets = malloc(5 * n * sizeof(float));  // [5][numel]: grads, params, states 0 and 1, init
    cr_assert_not_null(sets);
    for (int k = 0; k < 5; k++)
        for (size_t i = 0; i < n; i++) sets[k * n + i] = value(k == 4 ? 9 : k, i);
    fc_trace_writer w;
    fc_error e;
    cr_assert_eq(fc_trace_begin(&w, dir, m, sets + 4 * n, &e), 0, "%s", e.msg);
    fc_batch b;
    fc_batch_alloc(&b, &c->model, c->global_batch, c->seq_len);
    for (int i = 0; i < c->global_batch * c->seq_len; i++) b.input[i] = b.target[i] = i;
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    fc_trace_step s = {.step = 0, .loss = 1.5f, .batch = &b, .n_state = 2, .state_names = {names[0], names[1]}};
    cr_assert_eq(fc_trace_write_open(&w, &s, 1, &e), 0, "%s", e.msg);
    for (int k = 0; k < 4; k++) cr_assert_eq(fc_trace_write_put(&w, sets + k * n, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_trace_write_commit(&w, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_trace_finish(&w, c, 1, &e), 0, "%s", e.msg);
    fc_batch_free(&b);
    free(sets);
}

// Rewrites a safetensors file with its tensors in reverse order.
static void reverse_file(const char *path) {
    fc_st_file f;
    fc_error e;
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    fc_st_entry *ent = calloc((size_t)f.n_tensors, sizeof *ent);
    void **data = calloc((size_t)f.n_tensors, sizeof *data);
    for (int i = 0; i < f.n_tensors; i++) {
        const fc_st_tensor *t = &f.tensors[f.n_tensors - 1 - i];
        data[i] = malloc(t->end - t->begin + 1);
        cr_assert_eq(fc_st_read(&f, t, 0, t->numel, data[i], &e), 0, "%s", e.msg);
        ent[i] = (fc_st_entry){t->name, t->dtype, t->ndim, {0}, data[i]};
        for (int d = 0; d < t->ndim; d++) ent[i].shape[d] = t->shape[d];
    }
    cr_assert_eq(fc_st_write(path, ent, f.n_tensors, f.meta, f.n_meta, &e), 0, "%s", e.msg);
    for (int i = 0; i < f.n_tensors; i++) free(data[i]);
    free(data);
    free(ent);
    fc_st_close(&f);
}

// Views step 0 and init of the trace in dir; expects them mapped (owned NULL) or read.
static void expect_views(const char *dir, int mapped) {
    fc_trace t;
    fc_error e;
    cr_assert_eq(fc_trace_open(dir, &t, &e), 0, "%s", e.msg);
    size_t n = t.model.numel;
    fc_trace_view v, vi;
    fc_trace_step s;
    fc_batch b;
    cr_assert_eq(fc_trace_view_init(&t, &vi, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_trace_view_step(&t, 0, vi.sets[0], &v, &s, &b, &e), 0, "%s", e.msg);
    cr_expect_eq(v.owned == NULL, mapped, "step 0's sets %s", mapped ? "copied, not mapped" : "not read");
    cr_expect_eq(vi.owned == NULL, mapped, "init %s", mapped ? "copied, not mapped" : "not read");
    const float *got[5] = {s.grads, s.params, s.state[0], s.state[1], vi.sets[0]};
    size_t bad = 0;
    for (int k = 0; k < 5; k++)
        for (size_t i = 0; i < n; i++) bad += got[k][i] != value(k == 4 ? 9 : k, i);
    cr_expect_eq(bad, 0, "%zu elements differ from the sets written", bad);
    cr_expect_eq(s.prev_params, vi.sets[0]);
    cr_expect_eq(s.loss, 1.5f);
    cr_expect_eq(b.target[7], 7);
    // the same as fc_trace_read_step reads into buffers
    float *buf = malloc(4 * n * sizeof(float));
    float *bufs[4] = {buf, buf + n, buf + 2 * n, buf + 3 * n};
    fc_trace_step r;
    fc_batch rb;
    cr_assert_eq(fc_trace_read_step(&t, 0, bufs, NULL, &r, &rb, &e), 0, "%s", e.msg);
    cr_expect_eq(memcmp(buf, s.grads, n * sizeof(float)), 0);
    cr_expect_eq(memcmp(buf + 3 * n, s.state[1], n * sizeof(float)), 0);
    free(buf);
    fc_batch_free(&rb);
    fc_batch_free(&b);
    fc_trace_view_close(&v);
    fc_trace_view_close(&vi);
    cr_expect_null(v.map);
    fc_trace_close(&t);
}

static void setup(void) { tmp_setup("fc_view"); }

// A gpt2-tiny trace of one step, written into this test's directory; m gets its registry.
static const char *written_trace(fc_model *m) {
    fc_run_config c = cfg_of();
    fc_model_build_run(m, &c);
    const char *dir = tmp_path("trace");
    write_trace(dir, &c, m);
    return dir;
}

TestSuite(trace_view, .init = setup, .fini = tmp_teardown);

Test(trace_view, the_writers_layout_is_mapped_in_place) {
    fc_model m;
    const char *dir = written_trace(&m);
    expect_views(dir, 1);
    fc_model_free(&m);
}

Test(trace_view, another_order_is_read_into_memory_of_its_own) {
    fc_model m;
    const char *dir = written_trace(&m);
    char p[1200];
    snprintf(p, sizeof p, "%s/step-000000.safetensors", dir);
    reverse_file(p);
    snprintf(p, sizeof p, "%s/init.safetensors", dir);
    reverse_file(p);
    expect_views(dir, 0);
    fc_model_free(&m);
}

Test(trace_view, a_step_without_its_tensors_is_refused) {
    fc_model m;
    const char *dir = written_trace(&m);
    fc_trace t;
    fc_error e;
    cr_assert_eq(fc_trace_open(dir, &t, &e), 0, "%s", e.msg);
    t.tensor_steps = 0;  // as `run --trace-tensors first` says of its later steps
    fc_trace_view v;
    fc_trace_step s;
    fc_batch b;
    cr_expect_eq(fc_trace_view_step(&t, 0, NULL, &v, &s, &b, &e), -1);
    cr_expect_not_null(strstr(e.msg, "holds the tensors of its first 0 step(s) only"), "%s", e.msg);
    cr_expect_null(v.map);
    fc_trace_close(&t);
    fc_model_free(&m);
}
