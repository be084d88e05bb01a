// core/ckpt_pieces.c — the pieces of a SHARDED checkpoint (each rank's
// chunks of every unit's FlatParameter) and of a DCP one (torch's blocks of
// rows of every parameter): each placed by its layout entry, and all of them
// tiling every tensor exactly once. See checkpoint.h.
#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_internal.h"
#include "ckpt_read_internal.h"
#include "optim.h"

static int cmp_piece(const void *a, const void *b) {
    const fc_ckpt_piece *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return 0;
}

// One tensor of a shard file and its layout entry.
static int parse_piece(fc_ckpt *c, int file, const fc_st_tensor *t, const char *path, fc_ckpt_piece *out, fc_error *e) {
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
        *out = (fc_ckpt_piece){(int)unit, ti, file, t, first, count};
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
    const char *src = fc_ckpt_src_name(c);
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
            const fc_ckpt_piece *p = &c->pieces[k];
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

// Room for a piece per tensor of every file (at least one, so never NULL).
static void alloc_pieces(fc_ckpt *c) {
    int total = 0;
    for (int i = 0; i < c->man.n_files; i++) total += c->st[i].n_tensors;
    c->pieces = callocCheck((size_t)(total ? total : 1), sizeof *c->pieces);
}

// SHARDED: every shard file's tensors have a layout, and the chunks of all
// files tile every unit's every tensor exactly once.
int fc_ckpt_check_sharded(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    alloc_pieces(c);
    char path[1200], step[32];
    snprintf(step, sizeof step, "%ld", c->man.step);
    for (int i = 0; i < c->man.n_files; i++) {
        if (fc_ckpt_shard_index(c->man.files[i].name) < 0) continue;
        const fc_st_file *s = &c->st[i];
        fc_ckpt_where(c, c->man.files[i].name, path, sizeof path);
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
            return fc_fail(e, "%s: tensor '%s' is in two shard files", fc_ckpt_src_name(c), shown.s);
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
    c->pieces[c->n_pieces++] = (fc_ckpt_piece){p, ti, file, t, o[0] * cols, t->shape[0] * cols};
    return 0;
}

// DCP: every file is torch's (format, DCP_VERSION, a DCP_SHARDING_INFO entry
// for each tensor and none for another), and the blocks of all files tile
// every parameter's every tensor exactly once; AdamW's step is in one file.
int fc_ckpt_check_dcp(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    alloc_pieces(c);
    int *step_seen = callocCheck((size_t)m->n_params, sizeof *step_seen);
    char path[1200];
    int rc = 0;
    for (int i = 0; !rc && i < c->man.n_files; i++) {
        if (fc_ckpt_dcp_index(c->man.files[i].name) < 0) continue;
        const fc_st_file *s = &c->st[i];
        fc_ckpt_where(c, c->man.files[i].name, path, sizeof path);
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
            rc = fc_fail(e, "%s: no shard file holds state.%s.step", fc_ckpt_src_name(c),
                         m->params[p].name);
    free(step_seen);
    return rc ? -1 : tile(c, m->n_params, e);
}
