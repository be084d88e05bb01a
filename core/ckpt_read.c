// core/ckpt_read.c — opening a checkpoint, verifying everything before a
// single tensor byte is trusted, and reading element ranges from it. See
// checkpoint.h.
#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "ckpt_internal.h"
#include "fileio.h"
#include "optim.h"

#define MAX_CONFIG (1u << 20)

// One chunk of a sharded checkpoint: elements [first, first+count) of
// tensor t of `key` (SHARDED: a unit's FlatParameter; DCP: a parameter, a
// block of its rows), stored in file `file` as tensor st.
typedef struct {
    int key, t, file;
    const fc_st_tensor *st;
    uint64_t first, count;
} piece;

struct fc_ckpt {
    char src[1024];                 // the directory ("" for memory)
    const fc_ckpt_mem_file *mem;
    int n_mem;
    fc_ckpt_manifest man;
    char manifest_sha[65];
    fc_model model;
    int model_built;
    int n_tensors;                  // 1 + n_state
    const char *tensor_names[3];
    fc_st_file *st;                 // [n_files], aligned with man.files; open for .safetensors
    int model_file, optim_file;     // FULL: indices into st
    const fc_st_tensor **full;      // FULL: [n_tensors * n_params]
    piece *pieces;                  // SHARDED, DCP: sorted by (key, t, first)
    int n_pieces;
    int *piece_at;                  // [n_keys * n_tensors + 1]: pieces of (key, t) start here
    uint64_t bytes_read;
};

// The name of file i (or of the manifest) in messages: DIR/name, or name.
static const char *where(const fc_ckpt *c, const char *name, char *buf, size_t cap) {
    if (c->src[0]) snprintf(buf, cap, "%s/%s", c->src, name);
    else snprintf(buf, cap, "%s", name);
    return buf;
}

static const fc_ckpt_mem_file *mem_find(const fc_ckpt *c, const char *name) {
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

typedef struct {
    char s[300];
} described;

static described describe(const fc_model_config *m) {
    described d;
    fc_model_config_describe(m, d.s, sizeof d.s);
    return d;
}

// config.json must describe the model of the manifest's config.
static int check_config_json(fc_ckpt *c, const char *text, const char *path, fc_error *e) {
    fc_model_config mc;
    fc_error ce;
    if (fc_model_config_parse(text, path, &mc, &ce)) return fc_fail(e, "%s", ce.msg);
    if (!fc_model_config_equal(&mc, &c->man.cfg.model))
        return fc_fail(e, "%s: describes another model than the manifest's config (%s)", path,
                       describe(&c->man.cfg.model).s);
    return 0;
}

// adapter_config.json must be the LoraConfig of the model's adapters: every
// field the reference writes (ckpt_peft.c) with its value (a file PEFT wrote
// has more fields; they are not read).
static int check_peft_config_json(fc_ckpt *c, const char *text, const char *path, fc_error *e) {
    if (!fc_ckpt_peft_files(&c->model))
        return fc_fail(e, "%s: listed in the manifest, but model %s has no LoRA", path, c->model.cfg.name);
    cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fc_fail(e, "%s: not a JSON object", path);
    }
    cJSON *want = fc_ckpt_peft_config_json(&c->model);
    int rc = 0;
    const char *dup = fc_json_duplicate_key(j);
    if (dup) rc = fc_fail(e, "%s: key \"%s\" appears twice", path, fc_ckpt_show(dup).s);
    for (const cJSON *w = want->child; w && !rc; w = w->next) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, w->string);
        if (!v || !cJSON_Compare(w, v, 1)) {
            char *shown = cJSON_PrintUnformatted(w);
            jsonCheck(shown);
            rc = fc_fail(e, "%s: \"%s\" is not %s, the LoRA of model %s", path, w->string, fc_ckpt_show(shown).s,
                         describe(&c->man.cfg.model).s);
            cJSON_free(shown);
        }
    }
    cJSON_Delete(want);
    cJSON_Delete(j);
    return rc;
}

// The JSON files of a checkpoint, checked by their reader; 0 for safetensors.
static int json_kind(const char *name) {
    return !strcmp(name, FC_CKPT_CONFIG) ? 1 : !strcmp(name, FC_CKPT_PEFT_CONFIG) ? 2 : 0;
}

static int check_json(fc_ckpt *c, int kind, const char *text, const char *path, fc_error *e) {
    return kind == 1 ? check_config_json(c, text, path, e) : check_peft_config_json(c, text, path, e);
}

// Presence, size and (with check_hashes) SHA-256 of listed file i, then its
// contents: a safetensors header, or a JSON file (config.json, adapter_config.json).
static int verify_file(fc_ckpt *c, int i, int check_hashes, fc_error *e) {
    const fc_ckpt_file *F = &c->man.files[i];
    char path[1200];
    where(c, F->name, path, sizeof path);
    int is_config = json_kind(F->name);
    char hex[65];
    if (!c->src[0]) {  // in memory
        const fc_ckpt_mem_file *mf = mem_find(c, F->name);
        if (!mf) return fc_fail(e, "%s: listed in the manifest but missing", path);
        if ((uint64_t)mf->size != F->bytes)
            return fc_fail(e, "%s: %zu bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path, mf->size,
                           F->bytes);
        if (check_hashes) {
            fc_sha256_mem(mf->data, mf->size, hex);
            if (strcmp(hex, F->sha256) != 0)
                return fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path,
                               hex, F->sha256);
        }
        if (is_config) {
            if (mf->size > MAX_CONFIG || (mf->size && memchr(mf->data, '\0', mf->size)))
                return fc_fail(e, "%s: not a config.json", path);
            char *text = mallocCheck(mf->size + 1);
            if (mf->size) memcpy(text, mf->data, mf->size);
            text[mf->size] = '\0';
            int rc = check_json(c, is_config, text, path, e);
            free(text);
            return rc;
        }
        fc_error se;
        if (fc_st_open_mem(mf->data, mf->size, &c->st[i], &se)) return fc_fail(e, "%s: %s", path, se.msg);
        return 0;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return fc_fail(e, "%s: listed in the manifest but missing", path);
        return fc_fail(e, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return fc_fail(e, "%s: not a regular file", path);
    if ((uint64_t)st.st_size != F->bytes)
        return fc_fail(e, "%s: %lld bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path,
                       (long long)st.st_size, F->bytes);
    if (is_config) {
        char *text;
        size_t len;
        if (F->bytes > MAX_CONFIG) return fc_fail(e, "%s: too large for a config.json", path);
        if (fc_read_file_limited(path, MAX_CONFIG, &text, &len, e)) return -1;
        int rc = 0;
        if (len != F->bytes) rc = fc_fail(e, "%s: changed size while being verified", path);
        if (!rc && check_hashes) {
            fc_sha256_mem(text, len, hex);
            if (strcmp(hex, F->sha256) != 0)
                rc = fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path, hex,
                             F->sha256);
        }
        if (!rc) rc = check_json(c, is_config, text, path, e);
        free(text);
        return rc;
    }
    // Hash first (a flipped byte is reported as corruption, not as whatever
    // the header parser makes of it), then open, and make sure the file we
    // opened is the inode we hashed: the bytes read later are the verified ones.
    struct stat hashed = st;
    if (check_hashes) {
        FILE *fp = fopen(path, "rb");
        if (!fp) return fc_fail(e, "%s: cannot open: %s", path, strerror(errno));
        uint64_t size = 0;
        int rc = fstat(fileno(fp), &hashed) != 0 ? fc_fail(e, "%s: cannot stat: %s", path, strerror(errno))
                                                  : fc_sha256_fp(fp, path, &size, hex, e);
        fclose(fp);
        if (rc) return -1;
        if (size != F->bytes)
            return fc_fail(e, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path,
                           size, F->bytes);
        if (strcmp(hex, F->sha256) != 0)
            return fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path, hex,
                           F->sha256);
    }
    if (fc_st_open(path, &c->st[i], e)) return -1;
    struct stat now;
    if (fstat(fileno(c->st[i].fp), &now) != 0 || now.st_ino != hashed.st_ino || now.st_dev != hashed.st_dev ||
        c->st[i].file_size != F->bytes)
        return fc_fail(e, "%s: replaced while being verified (another save into this directory?)", path);
    return 0;
}

static int check_shape(const char *path, const fc_st_tensor *t, const fc_param *p, fc_error *e) {
    if (t->dtype != FC_DT_F32)
        return fc_fail(e, "%s: tensor '%s' is %s, not F32", path, fc_ckpt_show(t->name).s, fc_dtype_name(t->dtype));
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == (uint64_t)p->shape[d];
    if (!same) {
        char want[64];
        if (p->ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
        else snprintf(want, sizeof want, "[%lld]", (long long)p->shape[0]);
        return fc_fail(e, "%s: tensor '%s' does not have %s's shape %s", path, fc_ckpt_show(t->name).s, p->name, want);
    }
    return 0;
}

static int find_file(const fc_ckpt *c, const char *name) {
    for (int i = 0; i < c->man.n_files; i++)
        if (strcmp(c->man.files[i].name, name) == 0) return i;
    return -1;
}

// PEFT's adapter_model.safetensors of a LoRA model: every adapter under its
// PEFT name, F32 in its shape, bit for bit the one in model.safetensors
// (c->full[p]), and nothing else.
static int check_peft_model(fc_ckpt *c, int file, fc_error *e) {
    const fc_model *m = &c->model;
    fc_st_file *ps = &c->st[file];
    char path[1200], name[160];
    where(c, FC_CKPT_PEFT_MODEL, path, sizeof path);
    const char *fmt = fc_st_meta(ps, "format");
    if (!fmt || strcmp(fmt, "pt") != 0)
        return fc_fail(e, "%s: __metadata__ has no \"format\": \"pt\" (PEFT would not load it)", path);
    int n_lora = 0, rc = 0;
    for (int p = 0; p < m->n_params && !rc; p++) {
        if (!m->params[p].lora) continue;
        n_lora++;
        fc_ckpt_peft_name(m->params[p].name, name, sizeof name);
        const fc_st_tensor *t = fc_st_find(ps, name);
        if (!t) return fc_fail(e, "%s: adapter %s is missing", path, name);
        if (check_shape(path, t, &m->params[p], e)) return -1;
        size_t n = m->params[p].numel;
        float *a = mallocCheck(n * sizeof(float)), *b = mallocCheck(n * sizeof(float));
        if (fc_st_read(ps, t, 0, n, a, e) || fc_st_read(&c->st[c->model_file], c->full[p], 0, n, b, e))
            rc = -1;
        else if (memcmp(a, b, n * sizeof(float)) != 0)
            rc = fc_fail(e, "%s: adapter %s differs from %s in %s", path, name, m->params[p].name, FC_CKPT_MODEL);
        free(a);
        free(b);
    }
    if (!rc && ps->n_tensors != n_lora)
        rc = fc_fail(e, "%s: %d tensors, model %s has %d adapters", path, ps->n_tensors, m->cfg.name, n_lora);
    return rc;
}

// FULL: every parameter in model.safetensors, every state and the step in
// optimizer.safetensors, with their shapes, and nothing else; a LoRA model's
// adapters again in PEFT's two files (ckpt_peft.c), a model without none.
static int check_full(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    int np = m->n_params;
    c->model_file = find_file(c, FC_CKPT_MODEL);
    c->optim_file = find_file(c, FC_CKPT_OPTIM);
    c->full = callocCheck((size_t)(c->n_tensors * np), sizeof *c->full);
    char path[1200];
    const fc_st_file *ms = &c->st[c->model_file];
    where(c, FC_CKPT_MODEL, path, sizeof path);
    const char *fmt = fc_st_meta(ms, "format");
    if (!fmt || strcmp(fmt, "pt") != 0)
        return fc_fail(e, "%s: __metadata__ has no \"format\": \"pt\" (transformers would not load it)", path);
    for (int k = 0; k < ms->n_tensors; k++) {
        const fc_st_tensor *t = &ms->tensors[k];
        int p = fc_model_find(m, t->name);
        if (p < 0)
            return fc_fail(e, "%s: tensor '%s' is not a parameter of model %s", path, fc_ckpt_show(t->name).s,
                           m->cfg.name);
        if (check_shape(path, t, &m->params[p], e)) return -1;
        c->full[p] = t;
    }
    for (int p = 0; p < np; p++)
        if (!c->full[p]) return fc_fail(e, "%s: parameter %s is missing", path, m->params[p].name);

    fc_st_file *os = &c->st[c->optim_file];
    where(c, FC_CKPT_OPTIM, path, sizeof path);
    int have_step = 0;
    for (int k = 0; k < os->n_tensors; k++) {
        const fc_st_tensor *t = &os->tensors[k];
        if (strcmp(t->name, "step") == 0) {
            if (t->dtype != FC_DT_I64 || t->ndim != 0)
                return fc_fail(e, "%s: \"step\" must be an I64 scalar", path);
            int64_t step = 0;
            if (fc_st_read(os, t, 0, 1, &step, e)) return -1;
            if (step != c->man.step)
                return fc_fail(e, "%s: step %lld, the manifest says %ld", path, (long long)step, c->man.step);
            have_step = 1;
            continue;
        }
        const char *dot = strchr(t->name, '.');
        int ti = -1, p = -1;
        if (dot) {
            for (int s = 1; s < c->n_tensors; s++)
                if ((size_t)(dot - t->name) == strlen(c->tensor_names[s]) &&
                    strncmp(t->name, c->tensor_names[s], (size_t)(dot - t->name)) == 0)
                    ti = s;
            p = fc_model_find(m, dot + 1);
        }
        if (ti < 0 || p < 0)
            return fc_fail(e, "%s: tensor '%s' is not a state of the %s optimizer for a parameter of %s", path,
                           fc_ckpt_show(t->name).s, fc_opt_name(c->man.cfg.optim.kind), m->cfg.name);
        if (check_shape(path, t, &m->params[p], e)) return -1;
        c->full[ti * np + p] = t;
    }
    if (!have_step) return fc_fail(e, "%s: no \"step\" tensor", path);
    for (int s = 1; s < c->n_tensors; s++)
        for (int p = 0; p < np; p++)
            if (!c->full[s * np + p] && !m->params[p].frozen)  // a frozen parameter has none (it reads as 0)
                return fc_fail(e, "%s: optimizer state %s.%s is missing", path, c->tensor_names[s], m->params[p].name);
    int peft_model = find_file(c, FC_CKPT_PEFT_MODEL), peft_config = find_file(c, FC_CKPT_PEFT_CONFIG);
    where(c, FC_CKPT_MANIFEST, path, sizeof path);
    if (fc_ckpt_peft_files(m) && (peft_model < 0 || peft_config < 0))
        return fc_fail(e, "%s: \"files\" does not list %s, which PEFT writes for the LoRA of model %s", path,
                       peft_model < 0 ? FC_CKPT_PEFT_MODEL : FC_CKPT_PEFT_CONFIG, m->cfg.name);
    if (!fc_ckpt_peft_files(m) && (peft_model >= 0 || peft_config >= 0))
        return fc_fail(e, "%s: \"files\" lists %s, but model %s has no LoRA", path,
                       peft_model >= 0 ? FC_CKPT_PEFT_MODEL : FC_CKPT_PEFT_CONFIG, m->cfg.name);
    return peft_model >= 0 ? check_peft_model(c, peft_model, e) : 0;
}

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return 0;
}

// One tensor of a shard file and its layout entry.
static int parse_piece(fc_ckpt *c, int file, const fc_st_tensor *t, const char *path, piece *out, fc_error *e) {
    const fc_st_file *s = &c->st[file];
    const fc_model *m = &c->model;
    const char *layout = fc_st_meta(s, t->name);
    if (!layout)
        return fc_fail(e, "%s: tensor '%s' has no layout entry in __metadata__", path, fc_ckpt_show(t->name).s);
    cJSON *j = cJSON_ParseWithOpts(layout, NULL, 1);  // nothing after the JSON
    int rc = -1;
    uint64_t unit, first, count, numel;
    const char *uname = j ? fc_ckpt_json_str(j, "unit_name") : NULL, *tname = j ? fc_ckpt_json_str(j, "tensor") : NULL;
    if (!cJSON_IsObject(j) || fc_json_duplicate_key(j) || cJSON_GetArraySize(j) != 6 || !uname || !tname ||
        fc_ckpt_json_uint(j, "unit", 1e6, &unit) || fc_ckpt_json_uint(j, "first", FC_CKPT_JSON_MAX_INT, &first) ||
        fc_ckpt_json_uint(j, "count", FC_CKPT_JSON_MAX_INT, &count) ||
        fc_ckpt_json_uint(j, "unit_numel", FC_CKPT_JSON_MAX_INT, &numel)) {
        fc_fail(e, "%s: the layout of tensor '%s' is not {unit, unit_name, tensor, first, count, unit_numel}", path,
                fc_ckpt_show(t->name).s);
        goto done;
    }
    int ti = fc_ckpt_tensor_index(c, tname);
    char canon[96];
    snprintf(canon, sizeof canon, "unit%" PRIu64 ".%s", unit, tname);
    if (unit >= (uint64_t)m->n_units || strcmp(uname, m->units[unit].name) != 0 || numel != m->units[unit].numel) {
        fc_fail(e, "%s: tensor '%s' claims unit %" PRIu64 " '%s' of %" PRIu64 " elements, which model %s does not have",
                path, fc_ckpt_show(t->name).s, unit, fc_ckpt_show(uname).s, numel, m->cfg.name);
    } else if (ti < 0) {
        fc_fail(e, "%s: tensor '%s' holds '%s', which the %s optimizer does not keep", path, fc_ckpt_show(t->name).s,
                fc_ckpt_show(tname).s, fc_opt_name(c->man.cfg.optim.kind));
    } else if (strcmp(t->name, canon) != 0) {
        fc_fail(e, "%s: tensor '%s' is described as %s", path, fc_ckpt_show(t->name).s, canon);
    } else if (count == 0 || first > numel || count > numel - first) {
        fc_fail(e, "%s: tensor '%s': elements [%" PRIu64 ", +%" PRIu64 ") are outside the unit's %" PRIu64, path,
                fc_ckpt_show(t->name).s, first, count, numel);
    } else if (t->dtype != FC_DT_F32 || t->ndim != 1 || t->shape[0] != count) {
        fc_fail(e, "%s: tensor '%s' is not F32 [%" PRIu64 "] as its layout says", path, fc_ckpt_show(t->name).s, count);
    } else {
        *out = (piece){(int)unit, ti, file, t, first, count};
        rc = 0;
    }
done:
    cJSON_Delete(j);
    return rc;
}

// Key k of a sharded checkpoint's pieces in messages, and its elements.
static const char *key_text(const fc_ckpt *c, int k, char *buf, size_t cap) {
    const fc_model *m = &c->model;
    if (c->man.kind == FC_STATE_DICT_DCP) {
        snprintf(buf, cap, "%s", m->params[k].name);
    } else {
        snprintf(buf, cap, "unit %d (%s)", k, m->units[k].name[0] ? m->units[k].name : "(root)");
    }
    return buf;
}

static uint64_t key_numel(const fc_ckpt *c, int k) {
    return c->man.kind == FC_STATE_DICT_DCP ? c->model.params[k].numel : c->model.units[k].numel;
}

// The pieces of all files tile every key's every tensor exactly once.
static int tile(fc_ckpt *c, int n_keys, fc_error *e) {
    qsort(c->pieces, (size_t)c->n_pieces, sizeof *c->pieces, cmp_piece);
    int groups = n_keys * c->n_tensors;
    c->piece_at = callocCheck((size_t)groups + 1, sizeof *c->piece_at);
    const char *src = c->src[0] ? c->src : "checkpoint";
    char kt[200];
    int k = 0;
    for (int g = 0; g < groups; g++) {
        int key = g / c->n_tensors, t = g % c->n_tensors;
        c->piece_at[g] = k;
        uint64_t next = 0, numel = key_numel(c, key);
        // DCP: a frozen parameter has no optimizer state (it reads as 0), or a whole one
        if (c->man.kind == FC_STATE_DICT_DCP && t > 0 && c->model.params[key].frozen &&
            (k >= c->n_pieces || c->pieces[k].key != key || c->pieces[k].t != t))
            continue;
        for (; k < c->n_pieces && c->pieces[k].key == key && c->pieces[k].t == t; k++) {
            const piece *p = &c->pieces[k];
            if (p->first > next)
                return fc_fail(e, "%s: elements [%" PRIu64 ", %" PRIu64 ") of %s %s are in no shard file", src, next,
                               p->first, key_text(c, key, kt, sizeof kt), c->tensor_names[t]);
            if (p->first < next)
                return fc_fail(e, "%s: elements from %" PRIu64 " of %s %s are in two shard files (%s, %s)", src,
                               p->first, key_text(c, key, kt, sizeof kt), c->tensor_names[t],
                               c->man.files[c->pieces[k - 1].file].name, c->man.files[p->file].name);
            next = p->first + p->count;
        }
        if (next != numel)
            return fc_fail(e, "%s: elements [%" PRIu64 ", %" PRIu64 ") of %s %s are in no shard file", src, next, numel,
                           key_text(c, key, kt, sizeof kt), c->tensor_names[t]);
    }
    c->piece_at[groups] = k;
    return 0;
}

// SHARDED: every shard file's tensors have a layout, and the chunks of all
// files tile every unit's every tensor exactly once.
static int check_sharded(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    int total = 0;
    for (int i = 0; i < c->man.n_files; i++) total += c->st[i].n_tensors;
    c->pieces = callocCheck((size_t)(total ? total : 1), sizeof *c->pieces);
    char path[1200], step[32];
    snprintf(step, sizeof step, "%ld", c->man.step);
    for (int i = 0; i < c->man.n_files; i++) {
        if (fc_ckpt_shard_index(c->man.files[i].name) < 0) continue;
        const fc_st_file *s = &c->st[i];
        where(c, c->man.files[i].name, path, sizeof path);
        const char *fmt = fc_st_meta(s, "format"), *st = fc_st_meta(s, "step");
        if (!fmt || strcmp(fmt, FC_CKPT_SHARD_FORMAT) != 0)
            return fc_fail(e, "%s: __metadata__ \"format\" is not \"%s\"", path, FC_CKPT_SHARD_FORMAT);
        if (!st || strcmp(st, step) != 0)
            return fc_fail(e, "%s: saved at step %s, the manifest says %ld", path, st ? fc_ckpt_show(st).s : "(none)",
                           c->man.step);
        for (int k = 0; k < s->n_meta; k++) {
            const char *key = s->meta[k].key;
            if (!strcmp(key, "format") || !strcmp(key, "step") || !strcmp(key, "rank") || !strcmp(key, "world_size"))
                continue;
            if (!fc_st_find(s, key))
                return fc_fail(e, "%s: __metadata__ '%s' describes no tensor", path, fc_ckpt_show(key).s);
        }
        for (int k = 0; k < s->n_tensors; k++)
            if (parse_piece(c, i, &s->tensors[k], path, &c->pieces[c->n_pieces++], e)) return -1;
    }
    return tile(c, m->n_units, e);
}

// DCP: one tensor of a file. A model name is a parameter block; a
// "state.<name>.<state>" an optimizer state block; "state.<name>.step"
// AdamW's step. Its DCP_SHARDING_INFO entry places a block in the full tensor.
static int parse_dcp_tensor(fc_ckpt *c, int file, const fc_st_tensor *t, const cJSON *sharding, const char *path,
                            int *step_seen, fc_error *e) {
    const fc_model *m = &c->model;
    const char *name = t->name;
    fc_ckpt_shown shown = fc_ckpt_show(name);
    int p = fc_model_find(m, name), ti = 0, is_step = 0;
    if (p < 0 && strncmp(name, "state.", 6) == 0) {
        const char *dot = strrchr(name, '.');
        char pname[160];
        size_t len = (size_t)(dot - (name + 6));
        if (dot > name + 6 && len < sizeof pname) {
            memcpy(pname, name + 6, len);
            pname[len] = '\0';
            p = fc_model_find(m, pname);
            is_step = strcmp(dot + 1, "step") == 0;
            ti = is_step ? 0 : fc_ckpt_tensor_index(c, dot + 1);
            if (ti == 0 && !is_step) ti = -1;  // "param" is no state name
        }
        if (p >= 0 && (ti < 0 || (is_step && c->man.cfg.optim.kind != FC_OPT_ADAMW)))
            return fc_fail(e, "%s: tensor '%s' is not a state the %s optimizer keeps", path, shown.s,
                           fc_opt_name(c->man.cfg.optim.kind));
    }
    if (p < 0)
        return fc_fail(e, "%s: tensor '%s' is neither a parameter of model %s nor an optimizer state of one", path,
                       shown.s, m->cfg.name);
    const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sharding, name);
    const cJSON *off = cJSON_IsObject(ent) ? cJSON_GetObjectItemCaseSensitive(ent, "saved_offsets") : NULL;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(ent) != 1)
        return fc_fail(e, "%s: tensor '%s' has no {\"saved_offsets\": [...]} in DCP_SHARDING_INFO", path, shown.s);
    if (t->dtype != FC_DT_F32)
        return fc_fail(e, "%s: tensor '%s' is %s, not F32", path, shown.s, fc_dtype_name(t->dtype));
    const fc_param *P = &m->params[p];
    if (is_step) {
        float v = 0;
        if (t->ndim != 0 || cJSON_GetArraySize(off) != 0)
            return fc_fail(e, "%s: tensor '%s' must be a scalar with saved_offsets []", path, shown.s);
        if (step_seen[p]++)
            return fc_fail(e, "%s: tensor '%s' is in two shard files", c->src[0] ? c->src : "checkpoint", shown.s);
        if (fc_st_read(&c->st[file], t, 0, 1, &v, e)) return -1;
        if (v != (float)c->man.step)
            return fc_fail(e, "%s: tensor '%s' is %g, the manifest's step is %ld", path, shown.s, (double)v,
                           c->man.step);
        return 0;
    }
    int nd = cJSON_GetArraySize(off);
    uint64_t o[2] = {0, 0};
    for (int d = 0; d < nd && d < 2; d++) {
        const cJSON *x = cJSON_GetArrayItem(off, d);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > FC_CKPT_JSON_MAX_INT ||
            x->valuedouble != (double)(uint64_t)x->valuedouble)
            return fc_fail(e, "%s: tensor '%s': saved_offsets[%d] is not a non-negative integer", path, shown.s, d);
        o[d] = (uint64_t)x->valuedouble;
    }
    uint64_t rows = (uint64_t)P->shape[0], cols = P->numel / rows;
    if (t->ndim != P->ndim || nd != P->ndim || (P->ndim == 2 && t->shape[1] != cols))
        return fc_fail(e, "%s: tensor '%s' (%d-D, %d saved offsets) is not a block of rows of %s's shape", path,
                       shown.s, t->ndim, nd, P->name);
    if (o[1] != 0)
        return fc_fail(e, "%s: tensor '%s' starts at column %" PRIu64 ": only dim-0 blocks (FSDP2's shards) are read",
                       path, shown.s, o[1]);
    if (o[0] > rows || t->shape[0] > rows - o[0])
        return fc_fail(e, "%s: tensor '%s': rows [%" PRIu64 ", %" PRIu64 ") are outside %s's %" PRIu64, path, shown.s,
                       o[0], o[0] + t->shape[0], P->name, rows);
    if (t->shape[0] == 0) return 0;  // torch writes the empty shards of trailing ranks; they hold nothing
    c->pieces[c->n_pieces++] = (piece){p, ti, file, t, o[0] * cols, t->shape[0] * cols};
    return 0;
}

// DCP: every file is torch's (format, DCP_VERSION, a DCP_SHARDING_INFO entry
// for each tensor and none for another), and the blocks of all files tile
// every parameter's every tensor exactly once; AdamW's step is in one file.
static int check_dcp(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    int total = 0;
    for (int i = 0; i < c->man.n_files; i++) total += c->st[i].n_tensors;
    c->pieces = callocCheck((size_t)(total ? total : 1), sizeof *c->pieces);
    int *step_seen = callocCheck((size_t)m->n_params, sizeof *step_seen);
    char path[1200];
    int rc = 0;
    for (int i = 0; !rc && i < c->man.n_files; i++) {
        if (fc_ckpt_dcp_index(c->man.files[i].name) < 0) continue;
        const fc_st_file *s = &c->st[i];
        where(c, c->man.files[i].name, path, sizeof path);
        const char *fmt = fc_st_meta(s, "format"), *ver = fc_st_meta(s, "DCP_VERSION"),
                   *info = fc_st_meta(s, "DCP_SHARDING_INFO");
        if (!fmt || strcmp(fmt, "pt") != 0) {
            rc = fc_fail(e, "%s: __metadata__ has no \"format\": \"pt\"", path);
            break;
        }
        if (!ver || strcmp(ver, "1.0") != 0) {
            rc = fc_fail(e, "%s: __metadata__ \"DCP_VERSION\" is %s, not \"1.0\"", path, ver ? fc_ckpt_show(ver).s : "absent");
            break;
        }
        cJSON *j = info ? cJSON_ParseWithOpts(info, NULL, 1) : NULL;  // nothing after the JSON
        if (!cJSON_IsObject(j) || fc_json_duplicate_key(j)) {
            rc = fc_fail(e, "%s: __metadata__ \"DCP_SHARDING_INFO\" is %s", path,
                         info ? "not a JSON object of tensor names" : "absent");
        } else {
            for (const cJSON *k = j->child; k && !rc; k = k->next)
                if (!fc_st_find(s, k->string))
                    rc = fc_fail(e, "%s: DCP_SHARDING_INFO places '%s', which the file does not hold", path,
                                 fc_ckpt_show(k->string).s);
            for (int k = 0; k < s->n_tensors && !rc; k++)
                rc = parse_dcp_tensor(c, i, &s->tensors[k], j, path, step_seen, e);
        }
        cJSON_Delete(j);
    }
    for (int p = 0; !rc && p < m->n_params; p++)
        if (c->man.cfg.optim.kind == FC_OPT_ADAMW && !step_seen[p] && !m->params[p].frozen)
            rc = fc_fail(e, "%s: no shard file holds state.%s.step", c->src[0] ? c->src : "checkpoint",
                         m->params[p].name);
    free(step_seen);
    return rc ? -1 : tile(c, m->n_params, e);
}

static int open_common(fc_ckpt *c, int check_hashes, fc_error *e) {
    char path[1200];
    where(c, FC_CKPT_MANIFEST, path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    if (c->src[0]) {
        struct stat st;
        if (stat(c->src, &st) != 0 || !S_ISDIR(st.st_mode))
            return fc_fail(e, "%s: no such checkpoint directory", c->src);
        if (read_manifest(c, path, &text, &len, e)) return -1;
    } else {
        const fc_ckpt_mem_file *mf = mem_find(c, FC_CKPT_MANIFEST);
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
        if (verify_file(c, i, check_hashes, e)) return -1;
    if (c->man.kind == FC_STATE_DICT_FULL) return check_full(c, e);
    return c->man.kind == FC_STATE_DICT_SHARDED ? check_sharded(c, e) : check_dcp(c, e);
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
    int i = find_file(c, name);
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
        return fc_fail(e, "%s: %s", where(c, c->man.files[file].name, path, sizeof path), re.msg);
    c->bytes_read += n * sizeof(float);
    return 0;
}

// Elements [first, first+n) of key's tensor t from its pieces.
static int read_pieces(fc_ckpt *c, int key, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    int g = key * c->n_tensors + t;
    uint64_t end = first + n;
    for (int k = c->piece_at[g]; k < c->piece_at[g + 1]; k++) {
        const piece *p = &c->pieces[k];
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
    const char *src = c->src[0] ? c->src : "checkpoint";
    const fc_run_config *saved = &c->man.cfg;
    if (!fc_model_config_equal(&saved->model, &cfg->model))
        return fc_fail(e, "%s: saved from model %s; this run's --model is %s", src, describe(&saved->model).s,
                       describe(&cfg->model).s);
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
