// optimized/acts.c — see acts.h.
#include "acts.h"

#include <stdlib.h>
#include <string.h>

// Reserves n elements of sz bytes at the 256-byte aligned end of the half.
static size_t carve(size_t *end, size_t n, size_t sz) {
    size_t at = (*end + 255) / 256 * 256;
    *end = at + n * sz;
    return at;
}

void fc_cu_acts_layout(fc_cu_acts *a, const fc_model_config *c, int B, int T, fc_prec p) {
    memset(a, 0, sizeof *a);
    a->kind = c->kind;
    a->B = B;
    a->T = c->kind == FC_MODEL_MLP ? 1 : T;
    a->NT = B * a->T;
    a->esz = fc_prec_size(p);
    size_t NT = (size_t)a->NT, e = a->esz, f = sizeof(float), end = 0;
    if (c->kind == FC_MODEL_MLP) {
        a->n = c->n_layers;
        a->mlp_h = callocCheck((size_t)a->n, sizeof(size_t));
        a->mlp_y = callocCheck((size_t)a->n, sizeof(size_t));
        a->x0 = carve(&end, NT * (size_t)c->dims[0], e);
        for (int l = 0; l < a->n; l++) {
            a->mlp_h[l] = carve(&end, NT * (size_t)c->dims[l + 1], e);
            a->mlp_y[l] = carve(&end, NT * (size_t)c->dims[l + 1], e);
        }
        a->losses = carve(&end, NT, f);
    } else if (c->kind == FC_MODEL_LLAMA) {
        size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, I = (size_t)c->intermediate_size;
        size_t hd = (size_t)c->head_dim, Q = (size_t)c->n_head * hd, KV = (size_t)c->n_kv_head * hd;
        size_t att = (size_t)B * (size_t)c->n_head * (size_t)T * (size_t)T;
        a->n = c->n_layer;
        a->lay = callocCheck((size_t)a->n, sizeof *a->lay);
        a->encoded = carve(&end, NT * C, e);
        for (int l = 0; l < a->n; l++) {
            fc_cu_layer_off *y = &a->lay[l];
            y->ln1 = carve(&end, NT * C, e);
            y->ln1_rstd = carve(&end, NT, f);
            y->qp = carve(&end, NT * Q, e);
            y->kp = carve(&end, NT * KV, e);
            y->q = carve(&end, NT * Q, e);
            y->k = carve(&end, NT * KV, e);
            y->v = carve(&end, NT * KV, e);
            y->att = carve(&end, att, e);
            y->atty = carve(&end, NT * Q, e);
            y->attproj = carve(&end, NT * C, e);
            y->res2 = carve(&end, NT * C, e);
            y->ln2 = carve(&end, NT * C, e);
            y->ln2_rstd = carve(&end, NT, f);
            y->gate = carve(&end, NT * I, e);
            y->up = carve(&end, NT * I, e);
            y->h = carve(&end, NT * I, e);
            y->down = carve(&end, NT * C, e);
            y->res3 = carve(&end, NT * C, e);
        }
        a->lnf = carve(&end, NT * C, e);
        a->lnf_rstd = carve(&end, NT, f);
        a->logits = carve(&end, NT * V, e);
        a->losses = carve(&end, NT, f);
        a->rope_cos = carve(&end, (size_t)T * (hd / 2), f);
        a->rope_sin = carve(&end, (size_t)T * (hd / 2), f);
        if (c->lora_r > 0) {
            size_t widest = C > Q ? C : Q;
            if (KV > widest) widest = KV;
            if (I > widest) widest = I;
            a->lora_u = carve(&end, NT * (size_t)c->lora_r, e);
            a->lora_t = carve(&end, NT * widest, e);
        }
    } else {
        size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
        size_t att = (size_t)B * (size_t)c->n_head * (size_t)T * (size_t)T;
        a->n = c->n_layer;
        a->blk = callocCheck((size_t)a->n, sizeof *a->blk);
        a->encoded = carve(&end, NT * C, e);
        for (int l = 0; l < a->n; l++) {
            fc_cu_block_off *b = &a->blk[l];
            b->ln1 = carve(&end, NT * C, e);
            b->ln1_mean = carve(&end, NT, f);
            b->ln1_rstd = carve(&end, NT, f);
            b->qkv = carve(&end, NT * 3 * C, e);
            b->atty = carve(&end, NT * C, e);
            b->att = carve(&end, att, e);
            b->attproj = carve(&end, NT * C, e);
            b->res2 = carve(&end, NT * C, e);
            b->ln2 = carve(&end, NT * C, e);
            b->ln2_mean = carve(&end, NT, f);
            b->ln2_rstd = carve(&end, NT, f);
            b->fch = carve(&end, NT * 4 * C, e);
            b->fch_gelu = carve(&end, NT * 4 * C, e);
            b->fcproj = carve(&end, NT * C, e);
            b->res3 = carve(&end, NT * C, e);
        }
        a->lnf = carve(&end, NT * C, e);
        a->lnf_mean = carve(&end, NT, f);
        a->lnf_rstd = carve(&end, NT, f);
        a->logits = carve(&end, NT * V, e);
        a->losses = carve(&end, NT, f);
    }
    a->half = (end + 255) / 256 * 256;
}

void fc_cu_acts_free(fc_cu_acts *a) {
    free(a->blk);
    free(a->lay);
    free(a->mlp_h);
    free(a->mlp_y);
    memset(a, 0, sizeof *a);
}
