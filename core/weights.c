// core/weights.c — see weights.h.
#include "weights.h"

#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

// The model parameter a file's tensor name refers to: -1 = not a parameter
// but known to be skippable, -2 = unknown.
static int resolve(const fc_model *m, const char *name) {
    int i = fc_model_find(m, name);
    if (i >= 0) return i;
    if (m->cfg.kind == FC_MODEL_GPT2) {
        if (strcmp(name, "lm_head.weight") == 0) return -1;  // tied to wte
        if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return -1;
        char full[160];
        snprintf(full, sizeof full, "transformer.%s", name);
        i = fc_model_find(m, full);
        if (i >= 0) return i;
    }
    if (m->cfg.kind == FC_MODEL_LLAMA) {
        // a tied head may still be written (equal to embed_tokens); old files keep RoPE's buffer
        if (m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) return -1;
        if (ends_with(name, "rotary_emb.inv_freq")) return -1;
        char full[160];  // a LlamaModel's own file names its parameters without "model."
        snprintf(full, sizeof full, "model.%s", name);
        i = fc_model_find(m, full);
        if (i >= 0) return i;
    }
    return -2;
}

int fc_weights_load(const fc_model *m, const char *path, float *full, fc_error *e) {
    fc_st_file f;
    if (fc_st_open(path, &f, e)) return -1;
    int rc = -1;
    char *seen = callocCheck((size_t)m->n_params, 1);
    for (int t = 0; t < f.n_tensors; t++) {
        const fc_st_tensor *st = &f.tensors[t];
        int i = resolve(m, st->name);
        if (i == -1) continue;
        if (i == -2) {
            fc_fail(e, "%s: tensor '%s' is not a parameter of model %s", path, st->name, m->cfg.name);
            goto done;
        }
        const fc_param *p = &m->params[i];
        if (seen[i]) {
            fc_fail(e, "%s: parameter %s appears twice", path, p->name);
            goto done;
        }
        seen[i] = 1;
        int same = st->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = st->shape[d] == (uint64_t)p->shape[d];
        if (!same) {
            fc_fail(e, "%s: tensor '%s' has the wrong shape for %s", path, st->name, p->name);
            goto done;
        }
        if (fc_st_read_f32(&f, st, 0, p->numel, full + p->offset, e)) {
            if (e) {  // the reader names the tensor; the message names the file too
                char why[sizeof e->msg];
                snprintf(why, sizeof why, "%s", e->msg);
                fc_fail(e, "%s: %s", path, why);
            }
            goto done;
        }
    }
    for (int i = 0; i < m->n_params; i++)
        if (!seen[i]) {
            fc_fail(e, "%s: parameter %s is missing", path, m->params[i].name);
            goto done;
        }
    rc = 0;
done:
    free(seen);
    fc_st_close(&f);
    return rc;
}
