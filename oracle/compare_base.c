// oracle/compare_base.c — the bottom layer of the comparison engine: what
// every other compare*.c file asks and none of them defines, so that each
// calls only downwards (base <- policy, optim <- model <- compare.c <- print).
// Kind names, the compared range of elements, an optimizer state's index,
// the scratch arrays the per-element allowances live in, and the release of
// what a step's owner maps.
#include "compare.h"
#include "compare_model.h"

#include <stdlib.h>
#include <string.h>

static const char *KIND_NAMES[FC_CMP_KIND_COUNT] = {"batch", "loss", "norm", "grad", "param", "optim"};

const char *fc_cmp_kind_name(fc_cmp_kind k) { return k < FC_CMP_KIND_COUNT ? KIND_NAMES[k] : "?"; }

void fc_cmp_range(const fc_cmp_ctx *c, size_t *lo, size_t *hi) {
    const fc_param *p = c->only > 0 ? &c->m->params[c->only - 1] : NULL;
    *lo = p ? p->offset : 0;
    *hi = p ? p->offset + p->numel : c->m->numel;
}

int fc_cmp_find_state(const fc_trace_step *s, const char *name) {
    for (int i = 0; i < s->n_state; i++)
        if (!strcmp(s->state_names[i], name)) return i;
    return -1;
}

// ---------------------------------------------------------------------------
// scratch: the per-tensor arrays kept between tensors and steps

#define SCRATCH_SLOTS 6  // a tensor holds at most three at once (gradient, state, terms)
static struct {
    double *p;
    size_t n;
    int used;
} scratch[SCRATCH_SLOTS];

double *fc_cmp_scratch(size_t n) {
    int best = -1;  // the smallest free slot that holds n, else the largest free one, grown
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        if (scratch[i].used) continue;
        if (best < 0) best = i;
        int fits = scratch[i].n >= n, best_fits = scratch[best].n >= n;
        if (fits ? !best_fits || scratch[i].n < scratch[best].n : !best_fits && scratch[i].n > scratch[best].n)
            best = i;
    }
    if (best < 0) fc_die(FC_EXIT_INTERNAL, "%s:%d: more than %d allowance arrays at once", __FILE__, __LINE__,
                         SCRATCH_SLOTS);
    if (scratch[best].n < n) {
        free(scratch[best].p);
        scratch[best].p = mallocCheck(n * sizeof(double));
        scratch[best].n = n;
    }
    scratch[best].used = 1;
    return scratch[best].p;
}

void fc_cmp_scratch_release(double *p) {
    if (!p) return;
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        if (scratch[i].p == p && scratch[i].used) {
            scratch[i].used = 0;
            return;
        }
    fc_die(FC_EXIT_INTERNAL, "%s:%d: released an array that is not scratch", __FILE__, __LINE__);
}

// ---------------------------------------------------------------------------
// release: the sets a step's owner maps (fc_trace_step.release)

void fc_cmp_release(const fc_trace_step *s, const float *set, size_t off, size_t n) {
    if (s && s->release && set && n) s->release(s->release_arg, set + off, n);
}

void fc_cmp_release_all(const fc_trace_step *a, const fc_trace_step *b, size_t off, size_t n) {
    const fc_trace_step *both[2] = {a, b};
    for (int side = 0; side < 2; side++) {
        const fc_trace_step *s = both[side];
        if (!s || !s->release) continue;
        fc_cmp_release(s, s->grads, off, n);
        fc_cmp_release(s, s->params, off, n);
        fc_cmp_release(s, s->prev_params, off, n);
        for (int i = 0; i < s->n_state; i++) fc_cmp_release(s, s->state[i], off, n);
    }
}
