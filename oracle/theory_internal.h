// oracle/theory_internal.h — what the files of the theory share, private to
// them: the theory of one configuration at one rank (theory.c builds it), one
// step of a comm log indexed by micro-batch, stage and unit (theory.c fills
// the index, theory_events.c files the events in it), the small rules the
// passes have in common, and the passes themselves:
//  - theory_events.c: pass 1 (each event on its own) and 2 (their counts);
//  - theory_prefetch.c: pass 3 (issue order, prefetch and the limiter);
//  - theory_memory.c: the memory figures, fc_theory_check_memory.
#ifndef FC_THEORY_INTERNAL_H
#define FC_THEORY_INTERNAL_H

#include <stddef.h>

#include "dtype.h"
#include "layout.h"  // the structs only: the rules are the oracle's own (rules.h)
#include "model.h"
#include "rules.h"
#include "theory.h"

// ---------------------------------------------------------------------------
// the theory of one configuration at one rank

typedef struct {
    const fc_run_config *cfg;
    fc_model m;
    fc_groups g;
    int nu, ns, K;
    fc_unit_stages *st;        // [nu] the stages that use each unit
    fc_unit_layout *lay;       // [nu] each unit's flat layout at this rank
    int *fwd_opp;              // [nu] the forward stage whose next unit it is (its prefetch opportunity), -1 if none
    int *bwd_opp;              // [nu] likewise in backward
    size_t psz, rsz;           // bytes per element of param_dtype and reduce_dtype
    fc_sched_api api;          // whose schedule: the reference's, or real FSDP1's / FSDP2's (rules.h)
    fc_prefetch bwd_prefetch;  // the backward prefetch the API runs (FSDP2's is always pre)
    int per_param;             // FSDP2's per-parameter rows (the API, or the run's fsdp_version 2)
    int *ckpt;                 // [nu] activation checkpointing recomputes the unit in backward
    int *rec_gathers;          // [nu] ... and that recompute all-gathers and frees it itself
    size_t *frozen_store;      // [nu] elements of its store that are frozen parameters' (rules.h)
    size_t *frozen_real;       // [nu] ... of them real, not padding: the optimizer skips these
    int *trains;               // [nu] a parameter of the unit trains: else no gradient, no reduction
    long first_step;           // the log's first step: the process's first iteration
    fc_findings *out;
} theory;

#define EXPECT(t, cond, ...)                                 \
    do {                                                     \
        if (!(cond)) fc_findings_add((t)->out, __VA_ARGS__); \
    } while (0)

void theory_init(theory *t, const fc_run_config *cfg, int W, int rank, fc_sched_api api, fc_findings *out);
void theory_free(theory *t);

static inline int sync_micro(const theory *t, int k) { return !t->cfg->no_sync || k == t->K - 1; }
static inline int unit_of(const theory *t, int s) { return t->m.stages[s].unit; }
static inline int reshards(const theory *t, int u) {
    return fc_rule_frees_after_forward_as(t->api, t->cfg->strategy, &t->m, u);
}
// Micro-batch k's backward keeps the units gathered (FSDP1's ZeRO-2 under no_sync).
static inline int keeps_gathered(const theory *t, int k) {
    return k >= 0 && k < t->K && !sync_micro(t, k) && fc_rule_keeps_through_no_sync(t->api, t->cfg->strategy);
}
// Whether micro-batch k frees each unit in backward, and gathers it in forward.
static inline int frees_in_backward(const theory *t, int k) { return t->g.sharded && !keeps_gathered(t, k); }
static inline int gathers_in_forward(const theory *t, int k) { return t->g.sharded && !keeps_gathered(t, k - 1); }
static inline int valid_unit(const theory *t, int u) { return u >= 0 && u < t->nu; }
static inline int is_collective(fc_op op) {
    return op == FC_OP_ALL_GATHER || op == FC_OP_REDUCE_SCATTER || op == FC_OP_ALL_REDUCE;
}

// Bytes of n fp32 values: the master shards, their gradients, the offload copies.
static inline size_t fp32_bytes(size_t n) { return n * fc_prec_size(FC_PREC_FP32); }

// Bytes of unit u gathered: P_u in param_dtype (all_gather moves equal
// chunks, so padding is on the wire and in the gathered buffer).
static inline size_t gathered_bytes(const theory *t, int u) { return t->lay[u].padded * t->psz; }

// Elements a gathered unit holds in memory, parameters or unsharded
// gradient: FSDP1 computes in its padded FlatParameter (P_u); FSDP2 copies
// the all-gather's output out into the unpadded parameters (N_u), the output
// itself being a communication buffer.
static inline size_t held_elems(const theory *t, int u) { return t->per_param ? t->lay[u].numel : t->lay[u].padded; }

// ---------------------------------------------------------------------------
// one step of the log, indexed

typedef struct {
    int n;   // events of this kind
    int at;  // the first one's position in the step, -1 if none
} slot;

// events per (micro-batch, unit); AG_REC and FREE_REC: a recompute's own
// all-gather (the first of a recompute-gathering unit's two in backward, which
// backward prefetch may issue) and its free (phase recompute)
enum { AG_FWD, AG_BWD, FREE_FWD, FREE_BWD, RS, AR_WORLD, AR_REPL, D2H, AG_REC, FREE_REC, N_PER_UNIT };

typedef struct {
    const theory *t;
    long step;
    const fc_event *ev;  // the step's events
    int n;
    slot *fwd, *bwd;    // [K * ns] compute per stage
    slot *rec;          // [K * ns] activation checkpointing's recompute per stage (forward in phase recompute)
    slot *per_unit;     // [K * nu * N_PER_UNIT]
    slot *h2d, *optim;  // [nu] over the whole step
    slot norm;
    int *waited_by;     // [n] the wait completing collective i, -1 if none
    int *alive_before;  // [n + 1] units gathered (issued and not freed) before event i
} step_view;
// Micro-batch k of step x is the process's first iteration (FSDP1 learns its
// forward order there).
static inline int first_iteration(const step_view *x, int k) { return x->step == x->t->first_step && k == 0; }

// The slots of forward and backward compute of stage s, and of events of a
// per-unit kind (AG_FWD ...) of unit u, in micro-batch k.
static inline slot *fwd_slot(step_view *x, int k, int s) { return &x->fwd[k * x->t->ns + s]; }
static inline slot *bwd_slot(step_view *x, int k, int s) { return &x->bwd[k * x->t->ns + s]; }
static inline slot *rec_slot(step_view *x, int k, int s) { return &x->rec[k * x->t->ns + s]; }
static inline slot *unit_slot(step_view *x, int k, int u, int kind) {
    return &x->per_unit[((size_t)k * (size_t)x->t->nu + (size_t)u) * N_PER_UNIT + (size_t)kind];
}

// Pass 1 (theory_events.c): every event on its own, in order, filed in its
// slot. Returns the number of events of no expected kind.
int theory_scan_events(step_view *x);

// Pass 2 (theory_events.c): how many of each event, per micro-batch, stage
// and unit. Returns 1 when every count is right (pass 3 then finds each event
// in its slot).
int theory_check_counts(step_view *x);

// Pass 3 (theory_prefetch.c): the order of micro-batch k's events: compute
// and gradient reduction, and where sharded the frees and the issue of every
// all-gather under the prefetch policy and the limiter.
void theory_check_order(step_view *x, int k);

#endif
