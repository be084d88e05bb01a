// core/ckpt_verify.c — each file a checkpoint's manifest lists, checked
// before it is believed: presence, size, SHA-256, then its contents (a
// safetensors header, config.json, adapter_config.json); and a FULL
// checkpoint's tensors. See checkpoint.h.
#include <cJSON.h>
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

#define MAX_CONFIG (1u << 20)

// config.json must describe the model of the manifest's config.
static int check_config_json(fc_ckpt *c, const char *text, const char *path, fc_error *e) {
    fc_model_config mc;
    fc_error ce;
    if (fc_model_config_parse(text, path, &mc, &ce)) return fc_fail(e, "%s", ce.msg);
    if (!fc_model_config_equal(&mc, &c->man.cfg.model))
        return fc_fail(e, "%s: describes another model than the manifest's config (%s)", path,
                       fc_ckpt_describe(&c->man.cfg.model).s);
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
                         fc_ckpt_describe(&c->man.cfg.model).s);
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

// "PATH: SHA-256 ... does not match" unless hex is the manifest's sha256 of F.
static int check_sha(const fc_ckpt_file *F, const char *path, const char *hex, fc_error *e) {
    if (strcmp(hex, F->sha256) != 0)
        return fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path, hex,
                       F->sha256);
    return 0;
}

// Listed file i of a checkpoint in memory (fc_ckpt_open_mem); kind: json_kind.
static int verify_mem_file(fc_ckpt *c, int i, int kind, const char *path, int check_hashes, fc_error *e) {
    const fc_ckpt_file *F = &c->man.files[i];
    char hex[65];
    const fc_ckpt_mem_file *mf = fc_ckpt_mem_find(c, F->name);
    if (!mf) return fc_fail(e, "%s: listed in the manifest but missing", path);
    if ((uint64_t)mf->size != F->bytes)
        return fc_fail(e, "%s: %zu bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path, mf->size,
                       F->bytes);
    if (check_hashes) {
        fc_sha256_mem(mf->data, mf->size, hex);
        if (check_sha(F, path, hex, e)) return -1;
    }
    if (kind) {
        if (mf->size > MAX_CONFIG || (mf->size && memchr(mf->data, '\0', mf->size)))
            return fc_fail(e, "%s: not a config.json", path);
        char *text = mallocCheck(mf->size + 1);
        if (mf->size) memcpy(text, mf->data, mf->size);
        text[mf->size] = '\0';
        int rc = check_json(c, kind, text, path, e);
        free(text);
        return rc;
    }
    fc_error se;
    if (fc_st_open_mem(mf->data, mf->size, &c->st[i], &se)) return fc_fail(e, "%s: %s", path, se.msg);
    return 0;
}

// Listed JSON file i of a checkpoint on disk (kind: json_kind), read whole and checked.
static int verify_disk_json(fc_ckpt *c, int i, int kind, const char *path, int check_hashes, fc_error *e) {
    const fc_ckpt_file *F = &c->man.files[i];
    char *text, hex[65];
    size_t len;
    if (F->bytes > MAX_CONFIG) return fc_fail(e, "%s: too large for a config.json", path);
    if (fc_read_file_limited(path, MAX_CONFIG, &text, &len, e)) return -1;
    int rc = 0;
    if (len != F->bytes) rc = fc_fail(e, "%s: changed size while being verified", path);
    if (!rc && check_hashes) {
        fc_sha256_mem(text, len, hex);
        rc = check_sha(F, path, hex, e);
    }
    if (!rc) rc = check_json(c, kind, text, path, e);
    free(text);
    return rc;
}

// Listed safetensors file i of a checkpoint on disk. Hash first (a flipped byte is
// reported as corruption, not as whatever the header parser makes of it), then
// open, and make sure the file we opened is the inode we hashed: the bytes
// read later are the verified ones.
static int verify_disk_st(fc_ckpt *c, int i, const char *path, const struct stat *st, int check_hashes,
                          fc_error *e) {
    const fc_ckpt_file *F = &c->man.files[i];
    char hex[65];
    struct stat hashed = *st;
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
        if (check_sha(F, path, hex, e)) return -1;
    }
    if (fc_st_open(path, &c->st[i], e)) return -1;
    struct stat now;
    if (fstat(fileno(c->st[i].fp), &now) != 0 || now.st_ino != hashed.st_ino || now.st_dev != hashed.st_dev ||
        c->st[i].file_size != F->bytes)
        return fc_fail(e, "%s: replaced while being verified (another save into this directory?)", path);
    return 0;
}

// Presence, size and (with check_hashes) SHA-256 of listed file i, then its
// contents: a safetensors header, or a JSON file (config.json, adapter_config.json).
int fc_ckpt_verify_file(fc_ckpt *c, int i, int check_hashes, fc_error *e) {
    const fc_ckpt_file *F = &c->man.files[i];
    char path[1200];
    fc_ckpt_where(c, F->name, path, sizeof path);
    int kind = json_kind(F->name);
    if (!c->src[0]) return verify_mem_file(c, i, kind, path, check_hashes, e);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return fc_fail(e, "%s: listed in the manifest but missing", path);
        return fc_fail(e, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return fc_fail(e, "%s: not a regular file", path);
    if ((uint64_t)st.st_size != F->bytes)
        return fc_fail(e, "%s: %lld bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path,
                       (long long)st.st_size, F->bytes);
    if (kind) return verify_disk_json(c, i, kind, path, check_hashes, e);
    return verify_disk_st(c, i, path, &st, check_hashes, e);
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

// PEFT's adapter_model.safetensors of a LoRA model: every adapter under its
// PEFT name, F32 in its shape, bit for bit the one in model.safetensors
// (c->full[p]), and nothing else.
static int check_peft_model(fc_ckpt *c, int file, fc_error *e) {
    const fc_model *m = &c->model;
    fc_st_file *ps = &c->st[file];
    char path[1200], name[160];
    fc_ckpt_where(c, FC_CKPT_PEFT_MODEL, path, sizeof path);
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
int fc_ckpt_check_full(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    int np = m->n_params;
    c->model_file = fc_ckpt_find_file(c, FC_CKPT_MODEL);
    c->optim_file = fc_ckpt_find_file(c, FC_CKPT_OPTIM);
    c->full = callocCheck((size_t)(c->n_tensors * np), sizeof *c->full);
    char path[1200];
    const fc_st_file *ms = &c->st[c->model_file];
    fc_ckpt_where(c, FC_CKPT_MODEL, path, sizeof path);
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
    fc_ckpt_where(c, FC_CKPT_OPTIM, path, sizeof path);
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
    int peft_model = fc_ckpt_find_file(c, FC_CKPT_PEFT_MODEL), peft_config = fc_ckpt_find_file(c, FC_CKPT_PEFT_CONFIG);
    fc_ckpt_where(c, FC_CKPT_MANIFEST, path, sizeof path);
    if (fc_ckpt_peft_files(m) && (peft_model < 0 || peft_config < 0))
        return fc_fail(e, "%s: \"files\" does not list %s, which PEFT writes for the LoRA of model %s", path,
                       peft_model < 0 ? FC_CKPT_PEFT_MODEL : FC_CKPT_PEFT_CONFIG, m->cfg.name);
    if (!fc_ckpt_peft_files(m) && (peft_model >= 0 || peft_config >= 0))
        return fc_fail(e, "%s: \"files\" lists %s, but model %s has no LoRA", path,
                       peft_model >= 0 ? FC_CKPT_PEFT_MODEL : FC_CKPT_PEFT_CONFIG, m->cfg.name);
    return peft_model >= 0 ? check_peft_model(c, peft_model, e) : 0;
}
