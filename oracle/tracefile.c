// oracle/tracefile.c — see tracefile.h.
#define _DEFAULT_SOURCE  // madvise's MADV_DONTNEED (glibc): a view drops the pages it has read
#include "tracefile.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "optim.h"

// trace.json is a few kilobytes even for gpt2-124m; anything near this is not one.
#define TRACE_JSON_MAX (16u << 20)
// The same bound `run --steps` has, and room for a resumed run's first step.
#define MAX_STEPS 1000000L
#define MAX_FIRST_STEP 1000000000L

// ---------------------------------------------------------------------------
// trace.json

// An integer field in lo..hi.
static int json_long(const cJSON *j, const char *key, long lo, long hi, long *out, const char *where,
                     fc_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) return fc_fail(e, "%s: missing \"%s\"", where, key);
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < (double)lo || d > (double)hi)
        return fc_fail(e, "%s: \"%s\" must be an integer in %ld..%ld", where, key, lo, hi);
    *out = (long)d;
    return 0;
}

// The "units" array must be exactly the registry's layout: it is what the
// owner of a divergent element is computed from, so a trace whose recorded
// layout disagrees with the model it names is not trusted.
static int check_units(const cJSON *units, const fc_model *m, const char *where, fc_error *e) {
    if (!cJSON_IsArray(units)) return fc_fail(e, "%s: \"units\" missing or not an array", where);
    int n = cJSON_GetArraySize(units);
    if (n != m->n_units)
        return fc_fail(e, "%s: \"units\" lists %d units, the model %s has %d", where, n, m->cfg.name, m->n_units);
    for (int u = 0; u < n; u++) {
        const fc_unit *unit = &m->units[u];
        const cJSON *ju = cJSON_GetArrayItem(units, u);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(ju, "name");
        const cJSON *numel = cJSON_GetObjectItemCaseSensitive(ju, "numel");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(ju, "params");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, unit->name) != 0)
            return fc_fail(e, "%s: unit %d is not named \"%s\" as in the model registry", where, u, unit->name);
        if (!cJSON_IsNumber(numel) || numel->valuedouble != (double)unit->numel)
            return fc_fail(e, "%s: unit %d (\"%s\") must have numel %zu", where, u, unit->name, unit->numel);
        if (!cJSON_IsArray(params) || cJSON_GetArraySize(params) != unit->n_params)
            return fc_fail(e, "%s: unit %d (\"%s\") must list its %d parameters", where, u, unit->name,
                           unit->n_params);
        for (int k = 0; k < unit->n_params; k++) {
            const char *want = m->params[m->unit_params[unit->first_param + k]].name;
            const cJSON *p = cJSON_GetArrayItem(params, k);
            if (!cJSON_IsString(p) || strcmp(p->valuestring, want) != 0)
                return fc_fail(e, "%s: unit %d (\"%s\") parameter %d must be \"%s\"", where, u, unit->name, k,
                               want);
        }
    }
    return 0;
}

int fc_trace_parse(const char *text, size_t len, const char *where, fc_trace *t, fc_error *e) {
    memset(t, 0, sizeof *t);
    // cJSON wants a NUL-terminated string; a NUL inside the text would end the
    // parse early and hide whatever follows it, so it is refused outright.
    if (memchr(text, '\0', len)) return fc_fail(e, "%s: not valid JSON (contains a NUL byte)", where);
    char *buf = mallocCheck(len + 1);
    memcpy(buf, text, len);
    buf[len] = '\0';
    cJSON *j = cJSON_ParseWithOpts(buf, NULL, 1);  // 1: nothing but whitespace after the value
    free(buf);
    if (!j) return fc_fail(e, "%s: not valid JSON", where);
    int rc = -1, built = 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *impl = cJSON_GetObjectItemCaseSensitive(j, "implementation");
    long version = 0, world = 0;
    if (!cJSON_IsObject(j)) {
        fc_fail(e, "%s: not a JSON object", where);
        goto done;
    }
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FC_TRACE_FORMAT) != 0) {
        fc_fail(e, "%s: \"format\" is not \"%s\" (not an fsdpcheck trace)", where, FC_TRACE_FORMAT);
        goto done;
    }
    if (json_long(j, "version", 0, 1000000, &version, where, e)) goto done;
    if (version != FC_TRACE_VERSION) {
        fc_fail(e, "%s: trace format version %ld, this fsdpcheck reads version %d", where, version,
                FC_TRACE_VERSION);
        goto done;
    }
    if (!cJSON_IsString(impl) || !impl->valuestring[0] || strlen(impl->valuestring) >= sizeof t->impl) {
        fc_fail(e, "%s: \"implementation\" missing or not a non-empty string", where);
        goto done;
    }
    snprintf(t->impl, sizeof t->impl, "%s", impl->valuestring);
    if (json_long(j, "world_size", 1, 1L << 20, &world, where, e) ||
        json_long(j, "first_step", 0, MAX_FIRST_STEP, &t->first_step, where, e) ||
        json_long(j, "steps", 1, MAX_STEPS, &t->steps, where, e))
        goto done;
    t->world_size = (int)world;
    // "planned": true (`fsdpcheck plan`): no step was run, every step file holds
    // the batch alone, from step 0, and "tensor_steps" says 0
    const cJSON *planned = cJSON_GetObjectItemCaseSensitive(j, "planned");
    if (planned && !cJSON_IsBool(planned)) {
        fc_fail(e, "%s: \"planned\" is not true or false", where);
        goto done;
    }
    t->planned = cJSON_IsTrue(planned);
    if (t->planned && t->first_step != 0) {
        fc_fail(e, "%s: a plan (\"planned\": true) starts at step 0, not %ld", where, t->first_step);
        goto done;
    }
    // "tensor_steps": written only when the later step files hold no tensor set
    t->tensor_steps = t->steps;
    if ((cJSON_GetObjectItemCaseSensitive(j, "tensor_steps") || t->planned) &&
        json_long(j, "tensor_steps", t->planned ? 0 : 1, t->planned ? 0 : t->steps, &t->tensor_steps, where, e))
        goto done;
    fc_error ce;
    if (fc_run_config_from_json(cJSON_GetObjectItemCaseSensitive(j, "config"), &t->cfg, &ce) ||
        fc_run_config_validate_world(&t->cfg, t->world_size, &ce)) {
        fc_fail(e, "%s: %s", where, ce.msg);
        goto done;
    }
    fc_model_build_run(&t->model, &t->cfg);
    built = 1;
    if (check_units(cJSON_GetObjectItemCaseSensitive(j, "units"), &t->model, where, e)) goto done;
    t->n_state = fc_optim_state_names(&t->cfg.optim, t->state_names);
    rc = 0;
done:
    cJSON_Delete(j);
    if (rc && built) fc_model_free(&t->model);
    return rc;
}

// ---------------------------------------------------------------------------
// tensor-set validation against the registry

static void format_shape(char *buf, size_t cap, int ndim, const uint64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static int expect_tensor(const fc_st_file *f, const char *path, const char *name, fc_dtype dtype, int ndim,
                         const uint64_t *shape, fc_error *e) {
    const fc_st_tensor *t = fc_st_find(f, name);
    if (!t) return fc_fail(e, "%s: missing tensor \"%s\"", path, name);
    if (t->dtype != dtype)
        return fc_fail(e, "%s: tensor \"%s\" is %s, expected %s", path, name, fc_dtype_name(t->dtype),
                       fc_dtype_name(dtype));
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char got[160], want[160];
        format_shape(got, sizeof got, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, shape);
        return fc_fail(e, "%s: tensor \"%s\" has shape %s, expected %s", path, name, got, want);
    }
    return 0;
}

// Each parameter, F32 with its registry shape, under "<prefix>.<name>".
static int expect_set(const fc_st_file *f, const fc_model *m, const char *path, const char *prefix, fc_error *e) {
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        char name[256];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", p->name);
        uint64_t shape[2] = {(uint64_t)p->shape[0], (uint64_t)p->shape[1]};
        if (expect_tensor(f, path, name, FC_DT_F32, p->ndim, shape, e)) return -1;
    }
    return 0;
}

// Whether `name` is one of the tensors a step file of t holds.
static int expected_step_tensor(const fc_trace *t, const char *name) {
    if (!strcmp(name, "loss") || !strcmp(name, "batch.input") || !strcmp(name, "batch.target")) return 1;
    if (!strcmp(name, "grad_norm")) return 1;
    const char *rest = NULL;
    if (!strncmp(name, "grad.", 5)) rest = name + 5;
    else if (!strncmp(name, "param.", 6)) rest = name + 6;
    for (int s = 0; !rest && s < t->n_state; s++) {
        size_t k = strlen(t->state_names[s]);
        if (!strncmp(name, "optim.", 6) && !strncmp(name + 6, t->state_names[s], k) && name[6 + k] == '.')
            rest = name + 7 + k;
    }
    return rest && fc_model_find(&t->model, rest) >= 0;
}

// A file must hold exactly the expected names: the count must match, and a
// file with the right count but a stray name is missing some other one, which
// the per-name checks report first.
static int check_no_extra(const fc_st_file *f, const char *path, int expected, const fc_trace *t,
                          const fc_model *m, int is_init, fc_error *e) {
    if (f->n_tensors == expected) return 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *n = f->tensors[i].name;
        int ok = is_init ? fc_model_find(m, n) >= 0 : expected_step_tensor(t, n);
        if (!ok) return fc_fail(e, "%s: unexpected tensor \"%s\" (not in the trace's model %s)", path, n, m->cfg.name);
    }
    return fc_fail(e, "%s: holds %d tensors, expected %d", path, f->n_tensors, expected);
}

static int check_meta(const fc_st_file *f, const char *path, long step, fc_error *e) {
    const char *fmt = fc_st_meta(f, "format");
    if (fmt && strcmp(fmt, FC_TRACE_FORMAT) != 0)
        return fc_fail(e, "%s: metadata format is \"%s\", not \"%s\"", path, fmt, FC_TRACE_FORMAT);
    const char *s = fc_st_meta(f, "step");
    if (step >= 0 && s) {
        char want[32];
        snprintf(want, sizeof want, "%ld", step);
        if (strcmp(s, want) != 0)
            return fc_fail(e, "%s: metadata says step \"%s\", the file name says %ld", path, s, step);
    }
    return 0;
}

static void step_path(const fc_trace *t, long step, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/step-%06ld.safetensors", t->dir, step);
}

int fc_trace_step_open(const fc_trace *t, long step, fc_st_file *f, fc_error *e) {
    char path[1200];
    step_path(t, step, path, sizeof path);
    if (step < t->first_step || step >= t->first_step + t->steps)
        return fc_fail(e, "%s: step %ld is not in the trace (steps %ld..%ld)", t->dir, step, t->first_step,
                       t->first_step + t->steps - 1);
    if (access(path, F_OK) != 0)
        return fc_fail(e, "%s: missing (trace.json lists steps %ld..%ld: an incomplete trace)", path,
                       t->first_step, t->first_step + t->steps - 1);
    fc_error se;
    if (fc_st_open(path, f, &se)) return fc_fail(e, "%s", se.msg);
    const fc_run_config *c = &t->cfg;
    const fc_model *m = &t->model;
    uint64_t B = (uint64_t)c->global_batch;
    uint64_t scalar[1] = {0};
    uint64_t in_shape[2], tgt_shape[2] = {B, (uint64_t)c->seq_len};
    fc_dtype in_dtype;
    int in_ndim, tgt_ndim;
    if (fc_model_has_tokens(&c->model)) {
        in_shape[0] = B, in_shape[1] = (uint64_t)c->seq_len, in_dtype = FC_DT_I32, in_ndim = 2, tgt_ndim = 2;
    } else {
        in_shape[0] = B, in_shape[1] = (uint64_t)c->model.dims[0], in_dtype = FC_DT_F32, in_ndim = 2, tgt_ndim = 1;
    }
    int rc = check_meta(f, path, step, e);
    if (!rc && !t->planned) rc = expect_tensor(f, path, "loss", FC_DT_F32, 0, scalar, e);
    // the total gradient norm: what a clipping run's trace must carry (a plan ran no step)
    int has_norm = !t->planned && fc_st_find(f, "grad_norm") != NULL;
    if (!rc && !has_norm && c->clip_grad_norm > 0 && !t->planned)
        rc = fc_fail(e, "%s: missing tensor \"grad_norm\" (the config clips: clip_grad_norm %g; a trace of a clipping "
                        "run records the total norm clip_grad_norm_ returned, each step)",
                     path, (double)c->clip_grad_norm);
    if (!rc && has_norm) rc = expect_tensor(f, path, "grad_norm", FC_DT_F64, 0, scalar, e);
    if (!rc) rc = expect_tensor(f, path, "batch.input", in_dtype, in_ndim, in_shape, e);
    if (!rc) rc = expect_tensor(f, path, "batch.target", FC_DT_I32, tgt_ndim, tgt_shape, e);
    int sets = step < t->first_step + t->tensor_steps;  // a step past tensor_steps has loss, norm and batch only
    if (!rc && sets) rc = expect_set(f, m, path, "grad", e);
    if (!rc && sets) rc = expect_set(f, m, path, "param", e);
    for (int s = 0; !rc && sets && s < t->n_state; s++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "optim.%s", t->state_names[s]);
        rc = expect_set(f, m, path, prefix, e);
    }
    if (!rc) rc = check_no_extra(f, path, 3 - t->planned + has_norm + (sets ? (2 + t->n_state) * m->n_params : 0), t, m, 0, e);
    if (rc) fc_st_close(f);
    return rc;
}

// ---------------------------------------------------------------------------
// the directory

// A step file outside the listed steps means the directory mixes two runs
// (the writer removes every step file of an earlier run before it starts).
static int check_stray_steps(const fc_trace *t, fc_error *e) {
    DIR *d = opendir(t->dir);
    if (!d) return fc_fail(e, "%s: cannot list: %s", t->dir, strerror(errno));
    struct dirent *ent;
    int rc = 0;
    while (!rc && (ent = readdir(d)) != NULL) {
        const char *n = ent->d_name;
        size_t len = strlen(n);
        if (strncmp(n, "step-", 5) != 0 || len <= 5 + 12 || strcmp(n + len - 12, ".safetensors") != 0) continue;
        long step = 0;
        int digits = 1;
        for (size_t i = 5; i < len - 12; i++) {
            if (n[i] < '0' || n[i] > '9' || step > MAX_FIRST_STEP + MAX_STEPS) digits = 0;
            else step = step * 10 + (n[i] - '0');
        }
        if (!digits) continue;  // not a name the writer produces
        if (step < t->first_step || step >= t->first_step + t->steps)
            rc = fc_fail(e, "%s/%s: not one of the steps %ld..%ld trace.json lists (files of another run?)",
                         t->dir, n, t->first_step, t->first_step + t->steps - 1);
    }
    closedir(d);
    return rc;
}

int fc_trace_open(const char *dir, fc_trace *t, fc_error *e) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (stat(dir, &st) != 0) return fc_fail(e, "%s: cannot open trace directory: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return fc_fail(e, "%s: not a directory (a trace is a directory)", dir);
    char path[1200];
    if (snprintf(path, sizeof path, "%s/trace.json", dir) >= (int)sizeof path)
        return fc_fail(e, "%s: path too long", dir);
    if (access(path, F_OK) != 0)
        return fc_fail(e, "%s: no trace.json (an incomplete trace: the run did not finish, or this is not a trace)",
                       dir);
    char *text = NULL;
    size_t len = 0;
    int rc = fc_read_file_limited(path, TRACE_JSON_MAX, &text, &len, e);
    if (rc == FC_READ_TOO_LARGE) fc_fail(e, "%s: larger than %u bytes, not a trace.json", path, TRACE_JSON_MAX);
    if (rc) return -1;
    rc = fc_trace_parse(text, len, path, t, e);
    free(text);
    if (rc) return -1;
    snprintf(t->dir, sizeof t->dir, "%s", dir);

    fc_st_file f;
    fc_error se;
    snprintf(path, sizeof path, "%s/init.safetensors", dir);
    if (access(path, F_OK) != 0) {
        rc = fc_fail(e, "%s: missing (an incomplete trace)", path);
    } else if (fc_st_open(path, &f, &se)) {
        rc = fc_fail(e, "%s", se.msg);
    } else {
        rc = check_meta(&f, path, -1, e);
        if (!rc) rc = expect_set(&f, &t->model, path, "", e);
        if (!rc) rc = check_no_extra(&f, path, t->model.n_params, t, &t->model, 1, e);
        fc_st_close(&f);
    }
    for (long s = t->first_step; !rc && s < t->first_step + t->steps; s++) {
        rc = fc_trace_step_open(t, s, &f, e);
        if (!rc) fc_st_close(&f);
    }
    if (!rc) rc = check_stray_steps(t, e);
    if (rc) fc_trace_close(t);
    return rc;
}

void fc_trace_close(fc_trace *t) {
    fc_model_free(&t->model);
    memset(t, 0, sizeof *t);
}

// ---------------------------------------------------------------------------
// reading an open step file (already validated: names, dtypes and shapes)

int fc_trace_read_loss(fc_st_file *f, float *loss, fc_error *e) {
    return fc_st_read_f32(f, fc_st_find(f, "loss"), 0, 1, loss, e);
}

int fc_trace_read_norm(fc_st_file *f, int *has_norm, double *norm, fc_error *e) {
    const fc_st_tensor *t = fc_st_find(f, "grad_norm");
    *has_norm = t != NULL;
    *norm = 0;
    // F64 and a scalar (checked on open); the test machines and every trace are little-endian
    return t ? fc_st_read(f, t, 0, 1, norm, e) : 0;
}

int fc_trace_read_batch(const fc_trace *t, fc_st_file *f, fc_batch *b, fc_error *e) {
    const fc_run_config *c = &t->cfg;
    fc_batch_alloc(b, &c->model, c->global_batch, c->seq_len);
    const fc_st_tensor *in = fc_st_find(f, "batch.input"), *tgt = fc_st_find(f, "batch.target");
    // the test machines and every trace are little-endian: raw bytes are the values
    void *in_dst = fc_model_has_tokens(&c->model) ? (void *)b->input : (void *)b->features;
    if (fc_st_read(f, in, 0, in->numel, in_dst, e) || fc_st_read(f, tgt, 0, tgt->numel, b->target, e)) {
        fc_batch_free(b);
        return -1;
    }
    return 0;
}

int fc_trace_read_set(const fc_trace *t, fc_st_file *f, const char *prefix, float *dst, fc_error *e) {
    const fc_model *m = &t->model;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        char name[256];
        snprintf(name, sizeof name, "%s.%s", prefix, p->name);
        const fc_st_tensor *st = fc_st_find(f, name);
        if (!st) return fc_fail(e, "%s: step file has no tensor \"%s\"", t->dir, name);
        if (fc_st_read_f32(f, st, 0, p->numel, dst + p->offset, e)) return -1;
    }
    return 0;
}

// init's parameters from an open init.safetensors (at path) into dst[numel]
static int read_init_set(const fc_trace *t, fc_st_file *f, const char *path, float *dst, fc_error *e) {
    const fc_model *m = &t->model;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        const fc_st_tensor *st = fc_st_find(f, p->name);
        if (!st) return fc_fail(e, "%s: no tensor \"%s\"", path, p->name);
        if (fc_st_read_f32(f, st, 0, p->numel, dst + p->offset, e)) return -1;
    }
    return 0;
}

void fc_trace_init_file(const fc_trace *t, char *buf, size_t cap) { snprintf(buf, cap, "%s/init.safetensors", t->dir); }

int fc_trace_read_init(const fc_trace *t, float *dst, fc_error *e) {
    char path[1100];
    fc_trace_init_file(t, path, sizeof path);
    fc_st_file f;
    if (fc_st_open(path, &f, e)) return -1;
    int rc = read_init_set(t, &f, path, dst, e);
    fc_st_close(&f);
    return rc;
}

// A step whose tensor sets are asked for must hold them.
static int holds_tensors(const fc_trace *t, long step, fc_error *e) {
    if (step < t->first_step + t->tensor_steps) return 0;
    if (t->planned)
        return fc_fail(e, "%s, step %ld: a plan (fsdpcheck plan) ran no step and holds no tensors: compare judges "
                          "a run against it in lockstep, not with --trajectory, --bitwise or --same-compute",
                       t->dir, step);
    return fc_fail(e, "%s, step %ld: the trace holds the tensors of its first %ld step(s) only (run --trace-tensors "
                      "first): compare judges its later steps in lockstep, not with --trajectory, --bitwise or "
                      "--same-compute, and sensitivity takes a step it holds", t->dir, step, t->tensor_steps);
}

// A step's read failed: its batch released, e's message prefixed with the trace and step.
static int step_failed(const fc_trace *t, long step, fc_batch *batch, fc_error *e) {
    fc_batch_free(batch);
    char msg[sizeof e->msg];
    snprintf(msg, sizeof msg, "%s", e->msg);
    return fc_fail(e, "%s, step %ld: %s", t->dir, step, msg);
}

int fc_trace_read_step(const fc_trace *t, long step, float *const bufs[4], const float *prev, fc_trace_step *s,
                       fc_batch *batch, fc_error *e) {
    memset(s, 0, sizeof *s);
    memset(batch, 0, sizeof *batch);
    if (bufs && holds_tensors(t, step, e)) return -1;
    fc_st_file f;
    if (fc_trace_step_open(t, step, &f, e)) return -1;
    s->step = step;
    s->prev_params = prev;
    s->n_state = t->n_state;
    // a plan's step has no loss (NaN here) and no norm: only a lockstep re-run's are judged
    if (t->planned) s->loss = NAN;
    int rc = (!t->planned && (fc_trace_read_loss(&f, &s->loss, e) ||
                              fc_trace_read_norm(&f, &s->has_norm, &s->grad_norm, e))) ||
             fc_trace_read_batch(t, &f, batch, e);
    if (bufs)  // else the step's scalars and batch only
        rc = rc || fc_trace_read_set(t, &f, "grad", bufs[0], e) || fc_trace_read_set(t, &f, "param", bufs[1], e);
    for (int i = 0; !rc && bufs && i < t->n_state; i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "optim.%s", t->state_names[i]);
        rc = fc_trace_read_set(t, &f, prefix, bufs[2 + i], e);
        s->state_names[i] = t->state_names[i];
        s->state[i] = bufs[2 + i];
    }
    fc_st_close(&f);
    if (rc) return step_failed(t, step, batch, e);
    s->batch = batch;
    s->grads = bufs ? bufs[0] : NULL;
    s->params = bufs ? bufs[1] : NULL;
    return 0;
}

// ---------------------------------------------------------------------------
// views: the sets in place

// The set "<prefix>.<name>" (prefix "": init's "<name>") as a view into the
// mapped file, or NULL where the file does not hold it whole, F32, aligned,
// its tensors end to end in layout order (each at its offset in the full flat buffer).
static const float *set_in_place(const fc_trace *t, const fc_st_file *f, const uint8_t *map, const char *prefix) {
    const fc_model *m = &t->model;
    uint64_t start = 0;
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[i];
        char name[256];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", p->name);
        const fc_st_tensor *st = fc_st_find(f, name);
        if (!st || st->dtype != FC_DT_F32 || st->numel != p->numel) return NULL;
        if (i == 0 && st->begin < p->offset * sizeof(float)) return NULL;
        if (i == 0) start = st->begin - p->offset * sizeof(float);
        if (st->begin != start + p->offset * sizeof(float) || (f->data_start + start) % sizeof(float)) return NULL;
    }
    return (const float *)(map + f->data_start + start);
}

// Maps f's file (open at path) and points v->sets[0..n) at the sets named by
// prefixes, reading the ones not held in place into v->owned.
static int view_sets(const fc_trace *t, fc_st_file *f, const char *path, const char *const *prefixes, int n,
                     fc_trace_view *v, fc_error *e) {
    memset(v, 0, sizeof *v);
    size_t len = (size_t)f->file_size;
    // faulted in as read, not populated: a comparison holds one tensor of it at a time (fc_trace_view_release)
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fileno(f->fp), 0);
    if (map == MAP_FAILED) return fc_fail(e, "%s: cannot map %zu bytes: %s", path, len, strerror(errno));
    v->map = map;
    v->map_len = len;
    int copies = 0;
    const float *in_place[4];
    for (int i = 0; i < n; i++) copies += !(in_place[i] = set_in_place(t, f, map, prefixes[i]));
    size_t numel = t->model.numel;
    if (copies) v->owned = mallocCheck((size_t)copies * numel * sizeof(float));
    float *next = v->owned;
    for (int i = 0; i < n; i++) {
        if (in_place[i]) {
            v->sets[i] = in_place[i];
            continue;
        }
        int rc = *prefixes[i] ? fc_trace_read_set(t, f, prefixes[i], next, e) : read_init_set(t, f, path, next, e);
        if (rc) {
            fc_trace_view_close(v);
            return -1;
        }
        v->sets[i] = next;
        next += numel;
    }
    return 0;
}

int fc_trace_view_step(const fc_trace *t, long step, const float *prev, fc_trace_view *v, fc_trace_step *s,
                       fc_batch *batch, fc_error *e) {
    memset(v, 0, sizeof *v);
    if (holds_tensors(t, step, e) || fc_trace_read_step(t, step, NULL, prev, s, batch, e)) return -1;
    char path[1200];
    step_path(t, step, path, sizeof path);
    fc_st_file f;
    char prefixes[4][64] = {"grad", "param"};
    const char *const p[4] = {prefixes[0], prefixes[1], prefixes[2], prefixes[3]};
    for (int i = 0; i < t->n_state; i++) snprintf(prefixes[2 + i], sizeof prefixes[2 + i], "optim.%s", t->state_names[i]);
    int rc = fc_trace_step_open(t, step, &f, e);
    if (!rc) {
        rc = view_sets(t, &f, path, p, 2 + t->n_state, v, e);
        fc_st_close(&f);
    }
    if (rc) return step_failed(t, step, batch, e);
    s->grads = v->sets[0];
    s->params = v->sets[1];
    for (int i = 0; i < t->n_state; i++) {
        s->state_names[i] = t->state_names[i];
        s->state[i] = v->sets[2 + i];
    }
    return 0;
}

int fc_trace_view_init(const fc_trace *t, fc_trace_view *v, fc_error *e) {
    memset(v, 0, sizeof *v);
    char path[1100];
    fc_trace_init_file(t, path, sizeof path);
    fc_st_file f;
    if (fc_st_open(path, &f, e)) return -1;
    const char *const p[1] = {""};
    int rc = view_sets(t, &f, path, p, 1, v, e);
    fc_st_close(&f);
    return rc;
}

void fc_trace_view_release(const fc_trace_view *v, const float *p, size_t n) {
    uintptr_t lo = (uintptr_t)v->map, hi = lo + v->map_len, x = (uintptr_t)p;
    if (!v->map || !p || x < lo || x >= hi) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t from = x & ~(page - 1), to = x + n * sizeof(float);
    to = to > hi ? hi : to;
    // the mapping is private and never written: a dropped page is read again from the file
    if (madvise((void *)from, to - from, MADV_DONTNEED))
        fc_die(FC_EXIT_INTERNAL, "%s:%d: madvise of a trace view: %s", __FILE__, __LINE__, strerror(errno));
}

void fc_trace_view_release_all(const fc_trace_view *v) {
    if (v->map) fc_trace_view_release(v, (const float *)v->map, v->map_len / sizeof(float));
}

void fc_trace_view_close(fc_trace_view *v) {
    if (v->map) munmap(v->map, v->map_len);
    free(v->owned);
    memset(v, 0, sizeof *v);
}
