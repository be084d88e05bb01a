// oracle/trace.c — see trace.h.
#include "trace.h"

#include <cJSON.h>
#include <dirent.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "safetensors.h"

static void remove_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *ent;
    char path[2048];
    while ((ent = readdir(d)) != NULL) {
        const char *n = ent->d_name;
        size_t len = strlen(n);
        int is_step = strncmp(n, "step-", 5) == 0 && len > 12 && strcmp(n + len - 12, ".safetensors") == 0;
        if (is_step || strcmp(n, "trace.json") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, n);
            unlink(path);
        }
    }
    closedir(d);
}

int fc_trace_begin(fc_trace_writer *w, const char *dir, const fc_model *m,
                   const float *init_params, fc_error *e) {
    memset(w, 0, sizeof *w);
    if (snprintf(w->dir, sizeof w->dir, "%s", dir) >= (int)sizeof w->dir)
        return fc_fail(e, "%s: path too long", dir);
    w->m = m;
    w->tensor_steps = -1;
    if (fc_mkdir_p(dir, e)) return -1;
    remove_stale(dir);
    // in layout order (unit by unit, model.h), so the file holds the parameters as
    // one [numel] image of the full flat buffer, which a reader maps in place (tracefile.h)
    fc_st_entry *ent = callocCheck((size_t)m->n_params, sizeof *ent);
    for (int i = 0; i < m->n_params; i++) {
        const fc_param *p = &m->params[m->unit_params[i]];
        ent[i] = (fc_st_entry){p->name, FC_DT_F32, p->ndim, {(uint64_t)p->shape[0], (uint64_t)p->shape[1]},
                               init_params + p->offset};
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/init.safetensors", dir);
    fc_st_meta_kv meta[] = {{"format", FC_TRACE_FORMAT}, {"content", "init"}};
    // the tensor files of a trace are committed atomically, not durably (core/fileio.h: FC_ATOMIC)
    int rc = fc_st_write_as(path, ent, m->n_params, meta, 2, FC_ATOMIC, e);
    free(ent);
    return rc;
}

int fc_trace_finish(fc_trace_writer *w, const fc_run_config *cfg, int world, fc_error *e) {
    const fc_model *m = w->m;
    cJSON *j = cJSON_CreateObject();
    if (!j) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    cJSON_AddStringToObject(j, "format", FC_TRACE_FORMAT);
    cJSON_AddNumberToObject(j, "version", FC_TRACE_VERSION);
    cJSON_AddStringToObject(j, "implementation", cfg->impl);
    cJSON_AddNumberToObject(j, "world_size", world);
    cJSON_AddNumberToObject(j, "first_step", (double)w->first_step);
    cJSON_AddNumberToObject(j, "steps", (double)w->steps_written);
    if (w->tensor_steps >= 0) cJSON_AddNumberToObject(j, "tensor_steps", (double)w->tensor_steps);
    if (w->planned) cJSON_AddBoolToObject(j, "planned", 1);
    cJSON_AddItemToObject(j, "config", fc_run_config_to_json(cfg));
    // The layout, so a reader can say which unit (and later which rank) owns an element.
    cJSON *units = cJSON_AddArrayToObject(j, "units");
    for (int u = 0; u < m->n_units; u++) {
        cJSON *ju = cJSON_CreateObject();
        cJSON_AddStringToObject(ju, "name", m->units[u].name);
        cJSON_AddNumberToObject(ju, "numel", (double)m->units[u].numel);
        cJSON *ps = cJSON_AddArrayToObject(ju, "params");
        for (int k = 0; k < m->units[u].n_params; k++)
            cJSON_AddItemToArray(ps, cJSON_CreateString(m->params[m->unit_params[m->units[u].first_param + k]].name));
        cJSON_AddItemToArray(units, ju);
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory", __FILE__, __LINE__);
    char path[2048];
    snprintf(path, sizeof path, "%s/trace.json", w->dir);
    int rc = fc_write_file_atomic(path, text, strlen(text), e);
    free(text);
    return rc;
}

int fc_trace_begin_plan(fc_trace_writer *w, const char *dir, const fc_model *m, const float *init_params,
                        fc_error *e) {
    if (fc_trace_begin(w, dir, m, init_params, e)) return -1;
    w->planned = 1;
    w->tensor_steps = 0;
    return 0;
}

void fc_trace_abort(fc_trace_writer *w) {
    fc_st_stream_abort(&w->st);  // a step file half written: its temporary
    char path[2048];
    snprintf(path, sizeof path, "%s/init.safetensors", w->dir);
    unlink(path);
    for (long t = 0; t < w->steps_written; t++) {
        snprintf(path, sizeof path, "%s/step-%06ld.safetensors", w->dir, w->first_step + t);
        unlink(path);
    }
}

int fc_trace_write_open(fc_trace_writer *w, const fc_trace_step *s, int sets, fc_error *e) {
    const fc_model *m = w->m;
    if (w->steps_written == 0) w->first_step = s->step;
    if (sets && w->tensor_steps >= 0)
        return fc_fail(e, "step %ld: a trace's tensor sets are its first steps' (none after a step without)", s->step);
    if (!sets && w->tensor_steps < 0) w->tensor_steps = w->steps_written;
    if (w->planned && sets) return fc_fail(e, "step %ld: a plan's step files hold the batch alone", s->step);
    if (!sets && w->tensor_steps == 0 && !w->planned)
        return fc_fail(e, "step %ld: a trace's first step holds its tensor sets", s->step);
    int per = sets ? 2 + s->n_state : 0;  // grad, param, state...
    int n = 4 + per * m->n_params, k = 0;
    fc_st_entry *ent = callocCheck((size_t)n, sizeof *ent);
    char **names = callocCheck((size_t)n, sizeof *names);
    const fc_batch *b = s->batch;
    // a plan ran no step: it has no loss or norm to record
    if (!w->planned) ent[k++] = (fc_st_entry){"loss", FC_DT_F32, 0, {0}, &s->loss};
    // the total norm as clip_grad_norm_ returned it, in double: the reference's
    // is computed in double, and a float's value is a double exactly
    if (s->has_norm && !w->planned) ent[k++] = (fc_st_entry){"grad_norm", FC_DT_F64, 0, {0}, &s->grad_norm};
    if (b->kind != FC_MODEL_MLP) {
        ent[k++] = (fc_st_entry){"batch.input", FC_DT_I32, 2, {(uint64_t)b->B, (uint64_t)b->T}, b->input};
        ent[k++] = (fc_st_entry){"batch.target", FC_DT_I32, 2, {(uint64_t)b->B, (uint64_t)b->T}, b->target};
    } else {
        ent[k++] = (fc_st_entry){"batch.input", FC_DT_F32, 2, {(uint64_t)b->B, (uint64_t)b->in_dim}, b->features};
        ent[k++] = (fc_st_entry){"batch.target", FC_DT_I32, 1, {(uint64_t)b->B}, b->target};
    }
    const int head = k;  // loss, [grad_norm], the batch: written now; the sets by fc_trace_write_put
    for (int t = 0; t < per; t++) {  // each set in layout order, as init
        for (int i = 0; i < m->n_params; i++) {
            const fc_param *p = &m->params[m->unit_params[i]];
            char name[160];
            if (t == 0) snprintf(name, sizeof name, "grad.%s", p->name);
            else if (t == 1) snprintf(name, sizeof name, "param.%s", p->name);
            else snprintf(name, sizeof name, "optim.%s.%s", s->state_names[t - 2], p->name);
            names[k] = strdupCheck(name);
            ent[k] = (fc_st_entry){names[k], FC_DT_F32, p->ndim, {(uint64_t)p->shape[0], (uint64_t)p->shape[1]}, NULL};
            k++;
        }
    }
    char path[2048], step[32];
    snprintf(path, sizeof path, "%s/step-%06ld.safetensors", w->dir, s->step);
    snprintf(step, sizeof step, "%ld", s->step);
    fc_st_meta_kv meta[] = {{"format", FC_TRACE_FORMAT}, {"step", step}};
    int rc = fc_st_stream_open(&w->st, path, ent, k, meta, 2, FC_ATOMIC, e);
    for (int i = 0; !rc && i < head; i++) rc = fc_st_stream_put(&w->st, ent[i].data, e);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(ent);
    return rc;
}

int fc_trace_write_put(fc_trace_writer *w, const float *set, fc_error *e) {
    // one set a put: the stream refuses a set past the file's last (and aborts)
    const fc_model *m = w->m;
    for (int i = 0; i < m->n_params; i++)
        if (fc_st_stream_put(&w->st, set + m->params[m->unit_params[i]].offset, e)) return -1;
    return 0;
}

int fc_trace_write_commit(fc_trace_writer *w, fc_error *e) {
    if (fc_st_stream_commit(&w->st, e)) return -1;
    w->steps_written++;
    return 0;
}
