// oracle/signature_shapes.c — the wrong answers FSDP implementations produce,
// each built from A's step or from the step's pieces (signature.h), in the
// order they are tried: the most specific story first.
#include "signature_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "rerun.h"

// The pieces beyond this many bytes are not recomputed (gpt2-124m at W = 4 would need gigabytes).
#define PIECES_MAX_BYTES ((size_t)1 << 30)

// c x A for the constants a divide gets wrong.
static void shapes_scale(fc_sig *s) {
    const float *A = s->in->a->grads;
    double W = s->W, F = s->F;
    struct {
        double c;
        char text[160];
    } k[8];
    int n = 0;
    // a divide factor the run set explains its constant first (where D = W both name one number)
    double D = s->in->cfg->gradient_divide_factor;  // FSDP2's set_gradient_divide_factor, 0 when unset
    if (D > 0 && D != 1) {
        k[n].c = 1 / D, snprintf(k[n++].text, sizeof k[0].text, "B = A / D (D = %g, the gradient divide factor): "
                                 "divided by it twice", D);
        k[n].c = D, snprintf(k[n++].text, sizeof k[0].text, "B = D x A (D = %g, the gradient divide factor): "
                             "the factor not applied", D);
    }
    if (s->W > 1) {
        k[n].c = W, snprintf(k[n++].text, sizeof k[0].text, "B = W x A (W = %d): the gradients summed, never divided", s->W);
        k[n].c = 1 / W, snprintf(k[n++].text, sizeof k[0].text, "B = A / W (W = %d): divided by the world size twice", s->W);
    }
    if (s->F != s->W && s->F > 1) {
        k[n].c = F / W, snprintf(k[n++].text, sizeof k[0].text, "B = (F/W) x A (F = %d, W = %d): divided by the shard "
                                 "group's F where the world's W was meant, or the reverse", s->F, s->W);
        k[n].c = W / F, snprintf(k[n++].text, sizeof k[0].text, "B = (W/F) x A (F = %d, W = %d)", s->F, s->W);
    }
    k[n].c = 2, snprintf(k[n++].text, sizeof k[0].text, "B = 2 x A: a gradient counted twice");
    k[n].c = 0.5, snprintf(k[n++].text, sizeof k[0].text, "B = A / 2: a gradient halved once too often");
    for (int j = 0; j < n; j++) {
        int seen = 0;  // at W = 2, W x A is 2 x A: named once, by the first
        for (int q = 0; q < j; q++) seen |= k[q].c == k[j].c;
        if (seen) continue;
        for (size_t i = 0; i < s->n; i++) s->g[i] = (float)(k[j].c * A[i]);
        fc_sig_try_grad(s, k[j].text);
    }
}

// The pieces G[r*K + k] [numel]: the mean-loss gradient over micro-batch k of rank r's samples, at
// the step's start, and loss[r*K + k] their mean loss; NULL where they cannot be recomputed (not
// asked, too big, an uneven split).
static float *pieces(const fc_sig *s, float *loss) {
    const fc_sig_input *in = s->in;
    int B = in->cfg->global_batch, P = s->W * s->K;
    if (!in->pieces || B % P != 0 || (size_t)P * s->n * sizeof(float) > PIECES_MAX_BYTES) return NULL;
    fc_rerun rr;
    fc_error e;
    if (fc_piece_open(&rr, in->cfg, s->W, in->init, &e)) return NULL;
    float *G = mallocCheck((size_t)P * s->n * sizeof(float));
    int q = B / P;  // samples per piece: rank r reads [r B/W, (r+1) B/W), its micro-batch k the k-th q of them
    for (int j = 0; j < P && G; j++)
        if (fc_piece_grad(&rr, in->a->prev_params, in->a->step, j * q, q, G + (size_t)j * s->n, &loss[j], &e)) {
            free(G);
            G = NULL;
        }
    fc_rerun_close(&rr);
    return G;
}

// s->g = c x the sum of the ranks in mask (1 bit per rank) of their local means.
static void rank_sum(fc_sig *s, const float *G, const unsigned char *ranks, double c) {
    memset(s->g, 0, s->n * sizeof(float));
    for (int r = 0; r < s->W; r++)
        for (int k = 0; ranks[r] && k < s->K; k++) {
            const float *g = G + (size_t)(r * s->K + k) * s->n;
            for (size_t i = 0; i < s->n; i++) s->g[i] += (float)(c / s->K * g[i]);
        }
}

// s->g: each element from the ranks its owner o (a shard of group 0) names, times c: o alone, or
// (replicas) every rank holding o's shard, one per shard group.
static void by_owner(fc_sig *s, const float *G, int n_owners, int replicas, double c) {
    unsigned char *mask = callocCheck((size_t)s->W, 1);
    float *own = mallocCheck(s->n * sizeof(float));
    for (int o = 0; o < n_owners; o++) {
        for (int r = 0; r < s->W; r++) mask[r] = replicas ? r % s->F == o : r == o;
        rank_sum(s, G, mask, c);
        for (size_t i = 0; i < s->n; i++)
            if (s->owner[i] == o) own[i] = s->g[i];
    }
    memcpy(s->g, own, s->n * sizeof(float));
    free(own);
    free(mask);
}

// One rank's own gradient, never reduced: rank r's everywhere (what a replicated
// layout exports), or each shard's owner's (what a sharded one does).
static void shapes_local(fc_sig *s, const float *G, double lambda) {
    unsigned char *one = callocCheck((size_t)s->W, 1);
    char text[240];
    for (int v = 0; v < 2; v++) {
        double c = v ? lambda / s->W : lambda;
        const char *how = v ? ", divided by W as if it had been" : "";
        for (int r = 0; r < s->W; r++) {
            memset(one, 0, (size_t)s->W);
            one[r] = 1;
            rank_sum(s, G, one, c);
            snprintf(text, sizeof text, "B = rank %d's local gradient (its own samples' mean), never reduced%s", r, how);
            fc_sig_try_grad(s, text);
        }
        if (!s->owner) continue;
        by_owner(s, G, s->F, 0, c);
        snprintf(text, sizeof text, "B = each shard's owner's local gradient, never reduced%s", how);
        fc_sig_try_grad(s, text);
    }
    free(one);
}

// Hybrid sharding: reduced within a shard group and never across the
// replicas, or across the replicas and never within the shard group.
static void shapes_groups(fc_sig *s, const float *G, double lambda) {
    if (s->R < 2 || !s->sharded) return;
    unsigned char *mask = callocCheck((size_t)s->W, 1);
    char text[240];
    for (int v = 0; v < 2; v++) {
        const char *how = v ? ", divided by W" : "";
        for (int j = 0; j < s->R; j++) {
            for (int r = 0; r < s->W; r++) mask[r] = r / s->F == j;
            rank_sum(s, G, mask, v ? lambda / s->W : lambda / s->F);
            snprintf(text, sizeof text, "B reduced over shard group %d (ranks %d..%d) only%s, never all-reduced across "
                     "the %d replicas", j, j * s->F, j * s->F + s->F - 1, how, s->R);
            fc_sig_try_grad(s, text);
        }
        if (!s->owner) continue;
        by_owner(s, G, s->F, 1, v ? lambda / s->W : lambda / s->R);
        snprintf(text, sizeof text, "B reduced over each shard's replica group only%s, never within its shard group", how);
        fc_sig_try_grad(s, text);
    }
    free(mask);
}

// An accumulation that lost micro-batches: one of them, or all but the last.
static void shapes_micro(fc_sig *s, const float *G, double lambda) {
    if (s->K < 2) return;
    char text[240];
    double c = lambda / ((double)s->W * s->K);
    for (int drop = 0; drop <= s->K; drop++) {  // drop == K: every micro-batch but the last
        if (drop == s->K && s->K == 2) break;      // the same as dropping micro-batch 0
        memset(s->g, 0, s->n * sizeof(float));
        for (int r = 0; r < s->W; r++)
            for (int k = 0; k < s->K; k++) {
                if (drop < s->K ? k == drop : k != s->K - 1) continue;
                const float *g = G + (size_t)(r * s->K + k) * s->n;
                for (size_t i = 0; i < s->n; i++) s->g[i] += (float)(c * g[i]);
            }
        if (drop == s->K)
            snprintf(text, sizeof text, "B = the last micro-batch's gradient alone, of %d: the accumulation overwrote "
                     "instead of adding", s->K);
        else
            snprintf(text, sizeof text, "B = A without micro-batch %d of %d%s", drop, s->K,
                     drop == 0 && s->K == 2 ? ": the accumulation kept only the last (overwrote instead of adding)"
                                            : ": the accumulation dropped it");
        fc_sig_try_grad(s, text);
    }
}

// A sampler that hands the ranks the wrong samples: every rank rank 0's (not split by rank), or rank
// r rank r - 1's (off by one rank). The loss is the ranks' mean over what they read.
static void shapes_data(fc_sig *s, const float *G, const float *loss, double lambda) {
    if (s->W < 2) return;
    for (int v = 0; v < (s->W > 2 ? 2 : 1); v++) {  // at W = 2 the two are one
        memset(s->g, 0, s->n * sizeof(float));
        double l = 0;
        for (int r = 0; r < s->W; r++)
            for (int k = 0; k < s->K; k++) {
                int j = (v ? (r > 0 ? r - 1 : 0) : 0) * s->K + k;  // the piece rank r read
                const float *g = G + (size_t)j * s->n;
                for (size_t i = 0; i < s->n; i++) s->g[i] += (float)(lambda / ((double)s->W * s->K) * g[i]);
                l += loss[j] / ((double)s->W * s->K);
            }
        s->loss = l;
        fc_sig_try_grad(s, v ? "every rank r > 0 trained on rank r - 1's samples: a sampler off by one rank"
                             : "every rank trained on rank 0's samples: a sampler not split by rank");
    }
}

void fc_sig_shapes_grad(fc_sig *s) {
    const fc_run_config *c = s->in->cfg;
    shapes_scale(s);
    float *loss = mallocCheck((size_t)s->W * s->K * sizeof(float));
    float *G = pieces(s, loss);
    if (G) {
        // A = lambda x the mean of the pieces: set_gradient_divide_factor(F) leaves W / F times the mean
        double lambda = c->gradient_divide_factor > 0 ? s->W / c->gradient_divide_factor : 1.0;
        if (s->W > 1) shapes_local(s, G, lambda);
        shapes_groups(s, G, lambda);
        shapes_micro(s, G, lambda);
        shapes_data(s, G, loss, lambda);
        free(G);
    }
    free(loss);
    if (s->in->b_prev_grads) {
        memcpy(s->g, s->in->b_prev_grads, s->n * sizeof(float));
        fc_sig_try_grad(s, "B = the previous step's gradient (stale)");
    }
    fc_sig_shape_dtype(s);
}

void fc_sig_shape_dtype(fc_sig *s) {
    const fc_run_config *c = s->in->cfg;
    // reduce_dtype asked wider than param_dtype: a reduction in param_dtype leaves B on its grid
    if (c->param_dtype != FC_PREC_FP32 && c->reduce_dtype == FC_PREC_FP32 && fc_sig_on_grid(s, c->param_dtype)) {
        char text[200];
        snprintf(text, sizeof text, "B's gradients lie on the %s grid: reduced in %s, not the fp32 reduce_dtype asked "
                 "for", fc_prec_name(c->param_dtype), fc_prec_name(c->param_dtype));
        fc_sig_record(s, text);
    }
}

// Each owner's norm of A's gradient over the elements it holds, as norm_type says.
static void rank_norms(const fc_sig *s, double *norm) {
    const float *A = s->in->a->grads;
    fc_norm_type type = s->in->cfg->norm_type;
    for (int r = 0; r < s->W; r++) norm[r] = 0;
    for (size_t i = 0; i < s->n; i++) {
        double x = fabs((double)A[i]);
        double *acc = &norm[s->owner[i]];
        *acc = type == FC_NORM_INF ? fmax(*acc, x) : *acc + (type == FC_NORM_2 ? x * x : x);
    }
    if (type == FC_NORM_2)
        for (int r = 0; r < s->W; r++) norm[r] = sqrt(norm[r]);
}

// clip_grad_norm_ skipped, or driven by one rank's norm or a wrong total.
static void shapes_clip(fc_sig *s) {
    const fc_run_config *c = s->in->cfg;
    const fc_trace_step *a = s->in->a, *b = s->in->b;
    char text[300];
    fc_sig_finish h = fc_sig_finish_default(s);
    if (c->clip_grad_norm > 0) {
        h.unclipped = 1;
        snprintf(text, sizeof text, "B stepped with the unclipped gradient (clip_grad_norm_ to %g not applied)",
                 (double)c->clip_grad_norm);
        fc_sig_try_step(s, &h, text);
        h.unclipped = 0;
    }
    if (c->clip_grad_norm > 0 && s->owner) {
        double *norm = mallocCheck((size_t)s->W * sizeof(double)), *coef = mallocCheck((size_t)s->W * sizeof(double));
        rank_norms(s, norm);
        for (int r = 0; r < s->W; r++) coef[r] = fc_clip_coef(c->clip_grad_norm, norm[r]);
        h.rank_coef = coef;
        h.norm = norm[0];  // what rank 0, which reports, computed
        snprintf(text, sizeof text, "B clipped each shard by its own rank's norm, not the total (rank 0's %.6g, the "
                 "total %.6g)", norm[0], a->grad_norm);
        fc_sig_try_step(s, &h, text);
        h.rank_coef = NULL;
        free(norm);
        free(coef);
    }
    if (a->has_norm && b->has_norm && b->grad_norm >= 0 && b->grad_norm != a->grad_norm) {
        h.norm = b->grad_norm;
        float ca = fc_clip_coef(c->clip_grad_norm, a->grad_norm), cb = fc_clip_coef(c->clip_grad_norm, b->grad_norm);
        int moves = c->clip_grad_norm > 0 && (fc_clip_applies(c->clip_grad_norm, ca) || fc_clip_applies(c->clip_grad_norm, cb));
        snprintf(text, sizeof text, "B's total norm is %.9g, not its gradients' %.9g (x %.9g)%s", b->grad_norm,
                 a->grad_norm, a->grad_norm > 0 ? b->grad_norm / a->grad_norm : INFINITY,
                 moves ? ", and B clipped by it" : "; the gradients and the step are right");
        fc_sig_try_step(s, &h, text);
    }
}

void fc_sig_shapes_step(fc_sig *s) {
    const fc_run_config *c = s->in->cfg;
    shapes_clip(s);
    if (s->n_bad == 0) return;  // only the norm failed: the step's own shapes cannot differ from A
    char text[200];
    fc_sig_finish h = fc_sig_finish_default(s);
    h.updates = 0;
    fc_sig_try_step(s, &h, "B's parameters were not stepped");
    h.updates = 2;
    fc_sig_try_step(s, &h, "B's parameters were stepped twice");
    h.updates = 1;
    long other[3] = {1, s->t - 1, s->t + 1};
    for (int j = 0; j < 3 && c->optim.kind == FC_OPT_ADAMW; j++) {
        if (other[j] < 1 || other[j] == s->t || (j == 1 && other[j] == 1)) continue;
        h.t = other[j];
        snprintf(text, sizeof text, "B's optimizer used step count %ld, not %ld (AdamW's bias correction)", other[j],
                 s->t);
        fc_sig_try_step(s, &h, text);
    }
    h.t = s->t;
    int has_state = 0;
    for (int i = 0; i < s->in->a->n_state && !has_state; i++)
        for (size_t k = 0; k < s->n && !has_state; k++) has_state = s->start[i][k] != 0;
    if (has_state) {
        h.zero_state = 1;
        fc_sig_try_step(s, &h, "B's optimizer state restarted from zero (not restored, or not kept)");
    }
}
