// core/ckpt_write.c — writing a checkpoint: preparing its directory, then
// config.json, the full or shard safetensors files, and the manifest last.
// See checkpoint.h (crash safety).
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ckpt_internal.h"
#include "fileio.h"
#include "optim.h"

// Names an earlier checkpoint (or an interrupted save) may have left.
static int is_ckpt_file(const char *name) {
    const char *known[] = {FC_CKPT_MANIFEST, FC_CKPT_CONFIG, FC_CKPT_MODEL, FC_CKPT_OPTIM, FC_CKPT_PEFT_MODEL,
                           FC_CKPT_PEFT_CONFIG};
    char base[256];
    snprintf(base, sizeof base, "%s", name);
    char *tmp = strstr(base, ".tmp.");  // "<name>.tmp.<pid>": a temporary of a crashed write
    if (tmp) *tmp = '\0';
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(base, known[i])) return 1;
    return fc_ckpt_shard_index(base) >= 0 || fc_ckpt_dcp_index(base) >= 0;
}

int fc_ckpt_prepare_dir(const char *dir, fc_error *e) {
    if (fc_mkdir_p(dir, e)) return -1;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, FC_CKPT_MANIFEST);
    // the manifest goes first: from here on the old checkpoint no longer verifies
    int was_ckpt = unlink(path) == 0;
    if (!was_ckpt && errno != ENOENT)
        return fc_fail(e, "%s: cannot remove the old manifest: %s", path, strerror(errno));
    fc_fsync_dir(dir);
    // then the old checkpoint's files, so no stale shard outlives it, and
    // temporaries of interrupted saves; a directory that held no checkpoint
    // keeps its files (a model.safetensors of someone else's, say)
    DIR *d = opendir(dir);
    if (!d) return fc_fail(e, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (!is_ckpt_file(ent->d_name) || (!was_ckpt && !strstr(ent->d_name, ".tmp."))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (unlink(path) != 0 && errno != ENOENT) {
            int err = errno;
            closedir(d);
            return fc_fail(e, "%s: cannot remove: %s", path, strerror(err));
        }
    }
    closedir(d);
    return 0;
}

// Size and SHA-256 of a file just written, read back from what is on disk.
static int describe_file(const char *dir, const char *name, fc_ckpt_file *out, fc_error *e) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(out->name, sizeof out->name, "%s", name);
    return fc_sha256_file(path, &out->bytes, out->sha256, e);
}

// Prints j (and deletes it) into dir/name crash-safely; out (may be NULL)
// gets the name, size and SHA-256 of the bytes written.
static int write_json(const char *dir, const char *name, cJSON *j, fc_ckpt_file *out, fc_error *e) {
    char *text = cJSON_Print(j);
    jsonCheck(text);
    cJSON_Delete(j);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = strlen(text);
    int rc = fc_write_file_atomic(path, text, len, e);
    if (!rc && out) {
        snprintf(out->name, sizeof out->name, "%s", name);
        out->bytes = len;
        fc_sha256_mem(text, len, out->sha256);
    }
    free(text);
    return rc;
}

int fc_ckpt_write_config(const char *dir, const fc_ckpt_info *info, fc_ckpt_file *out, fc_error *e) {
    return write_json(dir, FC_CKPT_CONFIG, fc_model_config_to_json(&info->cfg->model), out, e);
}

static fc_st_entry param_entry(const fc_param *p, const char *name, const float *base) {
    return (fc_st_entry){name, FC_DT_F32, p->ndim, {(uint64_t)p->shape[0], (uint64_t)p->shape[1]}, base + p->offset};
}

// PEFT's files of a LoRA model (ckpt_peft.c): its adapters, and its LoraConfig.
static int write_peft(const char *dir, const fc_model *m, const float *params, fc_ckpt_file out[2], fc_error *e) {
    fc_st_entry *ent = callocCheck((size_t)m->n_params, sizeof *ent);
    char (*names)[160] = callocCheck((size_t)m->n_params, sizeof *names);
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (!m->params[i].lora) continue;
        if (fc_ckpt_peft_name(m->params[i].name, names[n], sizeof names[n]))
            fc_die(FC_EXIT_INTERNAL, "%s:%d: LoRA parameter %s has no PEFT name", __FILE__, __LINE__,
                   m->params[i].name);
        ent[n] = param_entry(&m->params[i], names[n], params);
        n++;
    }
    fc_st_meta_kv pt[] = {{"format", "pt"}};
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, FC_CKPT_PEFT_MODEL);
    int rc = fc_st_write(path, ent, n, pt, 1, e);
    if (!rc) rc = describe_file(dir, FC_CKPT_PEFT_MODEL, &out[0], e);
    if (!rc) rc = write_json(dir, FC_CKPT_PEFT_CONFIG, fc_ckpt_peft_config_json(m), &out[1], e);
    free(names);
    free(ent);
    return rc;
}

int fc_ckpt_write_full_files(const char *dir, const fc_ckpt_info *info, const float *params,
                             const float *const state[2], fc_ckpt_file out[FC_CKPT_FULL_FILES_MAX], fc_error *e) {
    const fc_model *m = info->m;
    const char *names[2];
    int n_state = fc_optim_state_names(&info->cfg->optim, names);
    // room for the model's entries, and for the step plus every state's
    fc_st_entry *ent = callocCheck((size_t)(m->n_params + 1 + n_state * m->n_params), sizeof *ent);
    char **owned = callocCheck((size_t)(n_state * m->n_params + 1), sizeof *owned);
    char path[1200], step_text[32];
    // model.safetensors: model names in registration order (Hugging Face's)
    for (int i = 0; i < m->n_params; i++) ent[i] = param_entry(&m->params[i], m->params[i].name, params);
    fc_st_meta_kv pt[] = {{"format", "pt"}};
    snprintf(path, sizeof path, "%s/%s", dir, FC_CKPT_MODEL);
    int rc = fc_st_write(path, ent, m->n_params, pt, 1, e);
    if (!rc) rc = describe_file(dir, FC_CKPT_MODEL, &out[0], e);
    // optimizer.safetensors: the step, then "<state>.<name>" per state and
    // trainable parameter (a frozen one has no state: torch writes none)
    int64_t step = info->step;
    int n = 0, k = 0;
    ent[n++] = (fc_st_entry){"step", FC_DT_I64, 0, {0}, &step};
    for (int s = 0; s < n_state; s++)
        for (int i = 0; i < m->n_params; i++) {
            if (m->params[i].frozen) continue;
            char name[160];
            snprintf(name, sizeof name, "%s.%s", names[s], m->params[i].name);
            owned[k] = strdupCheck(name);
            ent[n++] = param_entry(&m->params[i], owned[k++], state[s]);
        }
    char opt_name[32];
    snprintf(step_text, sizeof step_text, "%ld", info->step);
    snprintf(opt_name, sizeof opt_name, "%s", fc_opt_name(info->cfg->optim.kind));
    fc_st_meta_kv meta[] = {{"format", "fsdpcheck-optimizer"}, {"optimizer", opt_name}, {"step", step_text}};
    snprintf(path, sizeof path, "%s/%s", dir, FC_CKPT_OPTIM);
    if (!rc) rc = fc_st_write(path, ent, n, meta, 3, e);
    if (!rc) rc = describe_file(dir, FC_CKPT_OPTIM, &out[1], e);
    for (int i = 0; i < k; i++) free(owned[i]);
    free(owned);
    free(ent);
    if (!rc && fc_ckpt_peft_files(m)) rc = write_peft(dir, m, params, &out[2], e);
    return rc;
}

int fc_ckpt_write_shard(const char *dir, int index, const fc_ckpt_info *info,
                        const fc_ckpt_chunk_data *chunks, int n, fc_ckpt_file *out, fc_error *e) {
    const fc_model *m = info->m;
    const char *names[2];
    int n_state = fc_optim_state_names(&info->cfg->optim, names);
    int cap = n * (1 + n_state);
    fc_st_entry *ent = callocCheck((size_t)(cap ? cap : 1), sizeof *ent);
    fc_st_meta_kv *meta = callocCheck((size_t)cap + 4, sizeof *meta);
    char step[32], rank[32], world[32];
    snprintf(step, sizeof step, "%ld", info->step);
    snprintf(rank, sizeof rank, "%d", index);
    snprintf(world, sizeof world, "%d", info->world_size);
    int ne = 0, nm = 0;
    meta[nm++] = (fc_st_meta_kv){"format", FC_CKPT_SHARD_FORMAT};
    meta[nm++] = (fc_st_meta_kv){"step", step};
    meta[nm++] = (fc_st_meta_kv){"rank", rank};
    meta[nm++] = (fc_st_meta_kv){"world_size", world};
    for (int c = 0; c < n; c++) {
        const fc_ckpt_chunk_data *ch = &chunks[c];
        if (ch->count == 0) continue;
        const fc_unit *U = &m->units[ch->unit];
        for (int t = 0; t <= n_state; t++) {
            const char *tname = t == 0 ? "param" : names[t - 1];
            char name[96];
            snprintf(name, sizeof name, "unit%d.%s", ch->unit, tname);
            // the layout of this chunk, under the tensor's own name
            cJSON *j = cJSON_CreateObject();
            jsonCheck(j);
            jsonCheck(cJSON_AddNumberToObject(j, "unit", ch->unit));
            jsonCheck(cJSON_AddStringToObject(j, "unit_name", U->name));
            jsonCheck(cJSON_AddStringToObject(j, "tensor", tname));
            jsonCheck(cJSON_AddNumberToObject(j, "first", (double)ch->first));
            jsonCheck(cJSON_AddNumberToObject(j, "count", (double)ch->count));
            jsonCheck(cJSON_AddNumberToObject(j, "unit_numel", (double)U->numel));
            char *layout = cJSON_PrintUnformatted(j);
            jsonCheck(layout);
            cJSON_Delete(j);
            char *owned = strdupCheck(name);
            meta[nm++] = (fc_st_meta_kv){owned, layout};
            ent[ne++] = (fc_st_entry){owned, FC_DT_F32, 1, {ch->count}, t == 0 ? ch->param : ch->state[t - 1]};
        }
    }
    char file[64], path[1200];
    snprintf(file, sizeof file, "shard-%05d.safetensors", index);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = fc_st_write(path, ent, ne, meta, nm, e);
    if (!rc) rc = describe_file(dir, file, out, e);
    for (int i = 4; i < nm; i++) {
        free(meta[i].key);  // also the entry's name
        cJSON_free(meta[i].value);
    }
    free(meta);
    free(ent);
    return rc;
}

static cJSON *raw_uint(uint64_t v) {
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, v);
    cJSON *r = cJSON_CreateRaw(num);  // exact, never "1e+15"
    jsonCheck(r);
    return r;
}

fc_ckpt_rows fc_ckpt_rows_of_piece(const fc_model *m, int u, size_t unit_off, size_t count) {
    const fc_unit *U = &m->units[u];
    for (int q = 0; q < U->n_params; q++) {
        int p = m->unit_params[U->first_param + q];
        const fc_param *P = &m->params[p];
        if (unit_off < P->unit_offset || unit_off >= P->unit_offset + P->numel) continue;
        size_t cols = P->numel / (size_t)P->shape[0], at = unit_off - P->unit_offset;
        if (at % cols || count % cols || at + count > P->numel) break;
        return (fc_ckpt_rows){p, at / cols, count / cols, NULL, {NULL, NULL}};
    }
    fc_die(FC_EXIT_INTERNAL, "%s:%d: unit %d elements [%zu, +%zu) are not rows of one parameter", __FILE__, __LINE__,
           u, unit_off, count);
}

void fc_ckpt_dcp_name(int rank, char *out, size_t cap) {
    snprintf(out, cap, "shard-%05d-model-00001-of-00001.safetensors", rank + 1);
}

// DCP's flattened optimizer state name of parameter p's state s.
static char *state_name(const fc_param *p, const char *s) {
    char name[192];
    snprintf(name, sizeof name, "state.%s.%s", p->name, s);
    return strdupCheck(name);
}

int fc_ckpt_write_dcp(const char *dir, int rank, const fc_ckpt_info *info, const fc_ckpt_rows *blocks, int n,
                      int with_steps, int skew_offsets, fc_ckpt_file *out, fc_error *e) {
    const fc_model *m = info->m;
    const char *names[2];
    int n_state = fc_optim_state_names(&info->cfg->optim, names);
    int adam = info->cfg->optim.kind == FC_OPT_ADAMW;
    int cap = n * (1 + n_state) + (with_steps && adam ? m->n_params : 0);
    fc_st_entry *ent = callocCheck((size_t)(cap ? cap : 1), sizeof *ent);
    char **owned = callocCheck((size_t)(cap ? cap : 1), sizeof *owned);
    float step = (float)info->step;  // torch keeps AdamW's step as an F32 scalar per parameter
    cJSON *info_j = cJSON_CreateObject();  // DCP_SHARDING_INFO
    jsonCheck(info_j);
    int ne = 0;
    for (int b = 0; b < n; b++) {
        const fc_ckpt_rows *B = &blocks[b];
        if (B->rows == 0) continue;
        const fc_param *p = &m->params[B->param];
        uint64_t cols = p->numel / (uint64_t)p->shape[0];
        size_t r0 = B->row0 && skew_offsets ? B->row0 - (size_t)skew_offsets : B->row0;
        for (int t = 0; t <= (p->frozen ? 0 : n_state); t++) {  // a frozen parameter: no optimizer state
            char *name = t == 0 ? strdupCheck(p->name) : state_name(p, names[t - 1]);
            owned[ne] = name;
            ent[ne] = (fc_st_entry){name, FC_DT_F32, p->ndim, {B->rows, cols}, t == 0 ? B->data : B->state[t - 1]};
            ne++;
            cJSON *off = cJSON_CreateObject(), *arr = cJSON_CreateArray();
            jsonCheck(off);
            jsonCheck(arr);
            cJSON_AddItemToArray(arr, raw_uint(r0));
            if (p->ndim == 2) cJSON_AddItemToArray(arr, raw_uint(0));
            cJSON_AddItemToObject(off, "saved_offsets", arr);
            cJSON_AddItemToObject(info_j, name, off);
        }
    }
    for (int i = 0; with_steps && adam && i < m->n_params; i++) {
        if (m->params[i].frozen) continue;
        char *name = state_name(&m->params[i], "step");
        owned[ne] = name;
        ent[ne++] = (fc_st_entry){name, FC_DT_F32, 0, {0}, &step};
        cJSON *off = cJSON_CreateObject();
        jsonCheck(off);
        cJSON_AddItemToObject(off, "saved_offsets", cJSON_CreateArray());
        cJSON_AddItemToObject(info_j, name, off);
    }
    char *sharding = cJSON_PrintUnformatted(info_j);
    jsonCheck(sharding);
    cJSON_Delete(info_j);
    fc_st_meta_kv meta[] = {{"format", "pt"}, {"DCP_VERSION", "1.0"}, {"DCP_SHARDING_INFO", sharding}};
    char file[64], path[1200];
    fc_ckpt_dcp_name(rank, file, sizeof file);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = fc_st_write(path, ent, ne, meta, 3, e);
    if (!rc) rc = describe_file(dir, file, out, e);
    cJSON_free(sharding);
    for (int i = 0; i < ne; i++) free(owned[i]);
    free(owned);
    free(ent);
    return rc;
}


int fc_ckpt_write_manifest(const char *dir, const fc_ckpt_info *info, fc_state_dict kind,
                           const fc_ckpt_file *files, int n, fc_error *e) {
    const fc_run_config *cfg = info->cfg;
    cJSON *j = cJSON_CreateObject();
    jsonCheck(j);
    cJSON_AddStringToObject(j, "format", FC_CKPT_FORMAT);
    cJSON_AddNumberToObject(j, "version", FC_CKPT_VERSION);
    cJSON_AddStringToObject(j, "state_dict", fc_state_dict_name(kind));
    cJSON_AddItemToObject(j, "step", raw_uint((uint64_t)info->step));
    // data is a pure function of (seed, step, sample): the next step is the position
    cJSON_AddItemToObject(j, "data_position", raw_uint((uint64_t)info->step));
    cJSON_AddNumberToObject(j, "world_size", info->world_size);
    cJSON_AddStringToObject(j, "strategy", fc_strategy_name(info->strategy));
    cJSON_AddStringToObject(j, "model", cfg->model.name);
    cJSON *opt = cJSON_AddObjectToObject(j, "optimizer");
    jsonCheck(opt);
    cJSON_AddStringToObject(opt, "kind", fc_opt_name(cfg->optim.kind));
    const char *names[2];
    int n_state = fc_optim_state_names(&cfg->optim, names);
    cJSON *st = cJSON_AddArrayToObject(opt, "state");
    jsonCheck(st);
    for (int i = 0; i < n_state; i++) cJSON_AddItemToArray(st, cJSON_CreateString(names[i]));
    cJSON_AddItemToObject(j, "config", fc_run_config_to_json(cfg));
    cJSON *arr = cJSON_AddArrayToObject(j, "files");
    jsonCheck(arr);
    for (int i = 0; i < n; i++) {
        cJSON *f = cJSON_CreateObject();
        jsonCheck(f);
        cJSON_AddStringToObject(f, "name", files[i].name);
        cJSON_AddItemToObject(f, "bytes", raw_uint(files[i].bytes));
        cJSON_AddStringToObject(f, "sha256", files[i].sha256);
        cJSON_AddItemToArray(arr, f);
    }
    return write_json(dir, FC_CKPT_MANIFEST, j, NULL, e);
}

int fc_ckpt_save_full(const char *dir, const fc_ckpt_info *info, const float *params,
                      const float *const state[2], fc_error *e) {
    fc_ckpt_file files[1 + FC_CKPT_FULL_FILES_MAX];
    if (fc_ckpt_prepare_dir(dir, e) || fc_ckpt_write_config(dir, info, &files[0], e) ||
        fc_ckpt_write_full_files(dir, info, params, state, &files[1], e))
        return -1;
    return fc_ckpt_write_manifest(dir, info, FC_STATE_DICT_FULL, files, 1 + fc_ckpt_full_files(info->m), e);
}
