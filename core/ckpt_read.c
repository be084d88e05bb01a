// core/ckpt_read.c — opening a checkpoint, verifying everything before a
// single tensor byte is trusted (ckpt_verify.c, ckpt_pieces.c), and reading
// element ranges from it. See checkpoint.h.
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "ckpt_internal.h"
#include "ckpt_read_internal.h"
#include "fileio.h"
#include "optim.h"

// The name of file i (or of the manifest) in messages: DIR/name, or name.
const char *fc_ckpt_where(const fc_ckpt *c, const char *name, char *buf, size_t cap) {
    if (c->src[0]) snprintf(buf, cap, "%s/%s", c->src, name);
    else snprintf(buf, cap, "%s", name);
    return buf;
}

const fc_ckpt_mem_file *fc_ckpt_mem_find(const fc_ckpt *c, const char *name) {
    for (int i = 0; i < c->n_mem; i++)
        if (c->mem[i].name && strcmp(c->mem[i].name, name) == 0) return &c->mem[i];
    return NULL;
}

// The manifest: a regular file, as a save writes it, refused by its size
// before it is read.
static int read_manifest(const fc_ckpt *c, const char *path, char **text, size_t *len, fc_error *e) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return fc_fail(e, "%s: no %s manifest: not a checkpoint, or one whose save did not finish", c->src,
                           FC_CKPT_MANIFEST);
        return fc_fail(e, "%s: cannot open: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return fc_fail(e, "%s: not a regular file", path);
    if ((uint64_t)st.st_size > FC_CKPT_MAX_MANIFEST)
        return fc_fail(e, "%s: %lld bytes, over the %zu-byte limit", path, (long long)st.st_size,
                       (size_t)FC_CKPT_MAX_MANIFEST);
    return fc_read_file_limited(path, FC_CKPT_MAX_MANIFEST, text, len, e) ? -1 : 0;
}

fc_ckpt_described fc_ckpt_describe(const fc_model_config *m) {
    fc_ckpt_described d;
    fc_model_config_describe(m, d.s, sizeof d.s);
    return d;
}

int fc_ckpt_find_file(const fc_ckpt *c, const char *name) {
    for (int i = 0; i < c->man.n_files; i++)
        if (strcmp(c->man.files[i].name, name) == 0) return i;
    return -1;
}

static int open_common(fc_ckpt *c, int check_hashes, fc_error *e) {
    char path[1200];
    fc_ckpt_where(c, FC_CKPT_MANIFEST, path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    if (c->src[0]) {
        struct stat st;
        if (stat(c->src, &st) != 0 || !S_ISDIR(st.st_mode))
            return fc_fail(e, "%s: no such checkpoint directory", c->src);
        if (read_manifest(c, path, &text, &len, e)) return -1;
    } else {
        const fc_ckpt_mem_file *mf = fc_ckpt_mem_find(c, FC_CKPT_MANIFEST);
        if (!mf) return fc_fail(e, "(memory): no %s manifest", FC_CKPT_MANIFEST);
        text = mallocCheck(mf->size + 1);
        if (mf->size) memcpy(text, mf->data, mf->size);
        len = mf->size;
    }
    fc_sha256_mem(text, len, c->manifest_sha);
    int rc = fc_ckpt_manifest_parse(text, len, path, &c->man, e);
    free(text);
    if (rc) return -1;
    fc_model_build_run(&c->model, &c->man.cfg);
    c->model_built = 1;
    c->n_tensors = 1 + c->man.n_state;
    c->tensor_names[0] = "param";
    for (int s = 0; s < c->man.n_state; s++) c->tensor_names[1 + s] = c->man.state_names[s];
    c->st = callocCheck((size_t)c->man.n_files, sizeof *c->st);
    for (int i = 0; i < c->man.n_files; i++)
        if (fc_ckpt_verify_file(c, i, check_hashes, e)) return -1;
    if (c->man.kind == FC_STATE_DICT_FULL) return fc_ckpt_check_full(c, e);
    return c->man.kind == FC_STATE_DICT_SHARDED ? fc_ckpt_check_sharded(c, e) : fc_ckpt_check_dcp(c, e);
}

static int finish_open(fc_ckpt *c, int rc, fc_ckpt **out, fc_error *e) {
    if (rc) {
        fc_ckpt_close(c);
        *out = NULL;
        return fc_ckpt_one_line(e);
    }
    *out = c;
    return 0;
}

int fc_ckpt_open(const char *dir, int check_hashes, fc_ckpt **out, fc_error *e) {
    fc_ckpt *c = callocCheck(1, sizeof *c);
    if (!dir || !*dir || snprintf(c->src, sizeof c->src, "%s", dir) >= (int)sizeof c->src) {
        free(c);
        *out = NULL;
        return fc_fail(e, "checkpoint directory name empty or too long");
    }
    // "DIR/" and "DIR" name the same checkpoint; messages read better without the slash
    for (size_t n = strlen(c->src); n > 1 && c->src[n - 1] == '/'; n--) c->src[n - 1] = '\0';
    return finish_open(c, open_common(c, check_hashes, e), out, e);
}

int fc_ckpt_open_mem(const fc_ckpt_mem_file *files, int n, int check_hashes, fc_ckpt **out, fc_error *e) {
    fc_ckpt *c = callocCheck(1, sizeof *c);
    c->mem = files;
    c->n_mem = n;
    return finish_open(c, open_common(c, check_hashes, e), out, e);
}

void fc_ckpt_close(fc_ckpt *c) {
    if (!c) return;
    if (c->st)
        for (int i = 0; i < c->man.n_files; i++) fc_st_close(&c->st[i]);
    free(c->st);
    free(c->full);
    free(c->pieces);
    free(c->piece_at);
    if (c->model_built) fc_model_free(&c->model);
    fc_ckpt_manifest_free(&c->man);
    free(c);
}

const fc_ckpt_manifest *fc_ckpt_manifest_of(const fc_ckpt *c) { return &c->man; }
const fc_model *fc_ckpt_model(const fc_ckpt *c) { return &c->model; }
const char *fc_ckpt_manifest_sha256(const fc_ckpt *c) { return c->manifest_sha; }
uint64_t fc_ckpt_bytes_read(const fc_ckpt *c) { return c->bytes_read; }

const fc_st_file *fc_ckpt_st(const fc_ckpt *c, const char *name) {
    int i = fc_ckpt_find_file(c, name);
    return i >= 0 && strcmp(name, FC_CKPT_CONFIG) != 0 ? &c->st[i] : NULL;
}

int fc_ckpt_tensor_index(const fc_ckpt *c, const char *name) {
    for (int t = 0; t < c->n_tensors; t++)
        if (strcmp(name, c->tensor_names[t]) == 0) return t;
    return -1;
}

const char *fc_ckpt_tensor_name(const fc_ckpt *c, int t) {
    return t >= 0 && t < c->n_tensors ? c->tensor_names[t] : "?";
}

// ---------------------------------------------------------------------------
// reading element ranges

static int st_read(fc_ckpt *c, int file, const fc_st_tensor *t, uint64_t first, uint64_t n, float *dst,
                   fc_error *e) {
    char path[1200];
    fc_error re;
    if (fc_st_read_f32(&c->st[file], t, first, n, dst, &re))
        return fc_fail(e, "%s: %s", fc_ckpt_where(c, c->man.files[file].name, path, sizeof path), re.msg);
    c->bytes_read += n * sizeof(float);
    return 0;
}

// Elements [first, first+n) of key's tensor t from its pieces.
static int read_pieces(fc_ckpt *c, int key, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    int g = key * c->n_tensors + t;
    uint64_t end = first + n;
    for (int k = c->piece_at[g]; k < c->piece_at[g + 1]; k++) {
        const fc_ckpt_piece *p = &c->pieces[k];
        uint64_t lo = p->first > first ? p->first : first;
        uint64_t hi = p->first + p->count < end ? p->first + p->count : end;
        if (lo >= hi) continue;
        if (st_read(c, p->file, p->st, lo - p->first, hi - lo, dst + (lo - first), e)) return -1;
    }
    return 0;
}

int fc_ckpt_read(fc_ckpt *c, int p, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    if (p < 0 || p >= c->model.n_params || t < 0 || t >= c->n_tensors)
        return fc_fail(e, "checkpoint read: no parameter %d tensor %d", p, t);
    const fc_param *P = &c->model.params[p];
    if (first > P->numel || n > P->numel - first)
        return fc_fail(e, "checkpoint read: %s elements [%" PRIu64 ", +%" PRIu64 ") out of range", P->name, first, n);
    if (n == 0) return 0;
    // a frozen parameter saved without optimizer state (as torch saves it)
    int absent = c->man.kind == FC_STATE_DICT_FULL ? !c->full[t * c->model.n_params + p]
               : c->man.kind == FC_STATE_DICT_DCP  ? c->piece_at[p * c->n_tensors + t] == c->piece_at[p * c->n_tensors + t + 1]
                                                   : 0;
    if (t > 0 && absent) {
        memset(dst, 0, n * sizeof *dst);
        return 0;
    }
    if (c->man.kind == FC_STATE_DICT_FULL)
        return st_read(c, t == 0 ? c->model_file : c->optim_file, c->full[t * c->model.n_params + p], first, n, dst, e);
    if (c->man.kind == FC_STATE_DICT_DCP) return read_pieces(c, p, t, first, n, dst, e);
    return read_pieces(c, P->unit, t, P->unit_offset + first, n, dst, e);
}

int fc_ckpt_read_unit(fc_ckpt *c, int u, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    if (u < 0 || u >= c->model.n_units || t < 0 || t >= c->n_tensors)
        return fc_fail(e, "checkpoint read: no unit %d tensor %d", u, t);
    const fc_unit *U = &c->model.units[u];
    if (first > U->numel || n > U->numel - first)
        return fc_fail(e, "checkpoint read: unit %d elements [%" PRIu64 ", +%" PRIu64 ") out of range", u, first, n);
    if (n == 0) return 0;
    if (c->man.kind == FC_STATE_DICT_SHARDED) return read_pieces(c, u, t, first, n, dst, e);
    uint64_t end = first + n;
    for (int k = 0; k < U->n_params; k++) {
        int pi = c->model.unit_params[U->first_param + k];
        const fc_param *p = &c->model.params[pi];
        uint64_t a = p->unit_offset, b = a + p->numel;
        uint64_t lo = a > first ? a : first, hi = b < end ? b : end;
        if (lo >= hi) continue;
        if (fc_ckpt_read(c, pi, t, lo - a, hi - lo, dst + (lo - first), e)) return -1;
    }
    return 0;
}

int fc_ckpt_check_compatible(const fc_ckpt *c, const fc_run_config *cfg, fc_error *e) {
    const char *src = fc_ckpt_src_name(c);
    const fc_run_config *saved = &c->man.cfg;
    if (!fc_model_config_equal(&saved->model, &cfg->model))
        return fc_fail(e, "%s: saved from model %s; this run's --model is %s", src, fc_ckpt_describe(&saved->model).s,
                       fc_ckpt_describe(&cfg->model).s);
    const char *names[2];
    int n = fc_optim_state_names(&cfg->optim, names);
    int same = saved->optim.kind == cfg->optim.kind && n == c->man.n_state;
    for (int i = 0; same && i < n; i++) same = strcmp(names[i], c->man.state_names[i]) == 0;
    if (!same)
        return fc_fail(e, "%s: saved with optimizer %s keeping %d state tensor(s); this run's %s keeps %d",
                       src, fc_opt_name(saved->optim.kind), c->man.n_state, fc_opt_name(cfg->optim.kind), n);
    // a parameter frozen when saved has no optimizer state to continue from
    fc_model now;
    fc_model_build_run(&now, cfg);
    int bad = -1;
    for (int i = 0; i < now.n_params && bad < 0; i++)
        if (c->model.params[i].frozen && !now.params[i].frozen) bad = i;
    if (bad >= 0) {
        fc_fail(e, "%s: %s was frozen when saved (--freeze '%s'), so the checkpoint has no optimizer state for it; "
                   "this run trains it", src, now.params[bad].name, saved->freeze);
        fc_model_free(&now);
        return -1;
    }
    fc_model_free(&now);
    return 0;
}
