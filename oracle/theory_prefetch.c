// oracle/theory_prefetch.c — pass 3 of the schedule check: the order of one
// micro-batch's events, once pass 2 found each of them in its slot: compute
// stage by stage, the gradient path of every unit (reduce, replica
// all_reduce, d2h, norm, optimizer), the frees, and where each all-gather is
// issued under the prefetch policy (forward_prefetch, backward_prefetch
// pre/post/none) and the limiter (limit_all_gathers). The rules are
// theory.c's.
#include <stdio.h>

#include "theory_internal.h"

static int wait_of(const step_view *x, int i) { return i >= 0 ? x->waited_by[i] : -1; }

// Where forward (backward) stage s of micro-batch k has ended: its compute
// and, when it is the unit's last stage of the pass and the unit is freed
// there, that free. The next stage's work (its at-need gather) comes after.
static int end_fwd(step_view *x, int k, int s) {
    int u = unit_of(x->t, s), e = fwd_slot(x, k, s)->at;
    if (s == x->t->st[u].last_fwd && reshards(x->t, u) && unit_slot(x, k, u, FREE_FWD)->at > e)
        e = unit_slot(x, k, u, FREE_FWD)->at;
    return e;
}

static int end_bwd(step_view *x, int k, int s) {
    int u = unit_of(x->t, s), e = bwd_slot(x, k, s)->at;
    if (s == x->t->st[u].last_bwd && x->t->g.sharded && unit_slot(x, k, u, FREE_BWD)->at > e)
        e = unit_slot(x, k, u, FREE_BWD)->at;
    return e;
}

// Compute order, and the gradient path of every unit: reduce after the last
// backward compute, the replica all_reduce after the reduce_scatter
// completed, d2h after the reduction completed, the norm after every
// reduction and the optimizer after its unit's (and, when it clips, the norm).
static void check_compute_and_reduce_order(step_view *x, int k) {
    const theory *t = x->t;
    long step = x->step;
    int syncs = sync_micro(t, k);  // micro-batch k reduces gradients
    for (int s = 0; s + 1 < t->ns; s++) {
        EXPECT(t, fwd_slot(x, k, s)->at < fwd_slot(x, k, s + 1)->at,
               "step %ld micro %d: forward of stage %d after stage %d", step, k, s, s + 1);
        EXPECT(t, bwd_slot(x, k, s + 1)->at < bwd_slot(x, k, s)->at,
               "step %ld micro %d: backward of stage %d after stage %d", step, k, s + 1, s);
    }
    EXPECT(t, fwd_slot(x, k, t->ns - 1)->at < bwd_slot(x, k, t->ns - 1)->at,
           "step %ld micro %d: backward starts before forward ends", step, k);
    if (k + 1 < t->K)
        EXPECT(t, bwd_slot(x, k, 0)->at < fwd_slot(x, k + 1, 0)->at, "step %ld: micro-batch %d starts before %d ends",
               step, k + 1, k);
    for (int u = 0; u < t->nu; u++) {
        int lastb = bwd_slot(x, k, t->st[u].last_bwd)->at, fin = -1;
        if (syncs && t->trains[u]) {  // a unit with no trainable parameter reduces nothing
            int red = unit_slot(x, k, u, t->g.sharded ? RS : AR_WORLD)->at;
            EXPECT(t, red > lastb, "step %ld micro %d: %s of unit %d (#%d) before its last backward compute (#%d)",
                   step, k, t->g.sharded ? "reduce_scatter" : "all_reduce", u, red, lastb);
            fin = red;
            if (t->g.hybrid && t->g.R > 1) {
                int ar = unit_slot(x, k, u, AR_REPL)->at;
                EXPECT(
                    t, ar > wait_of(x, red),
                    "step %ld micro %d: replica all_reduce of unit %d (#%d) before its reduce_scatter completed (#%d)",
                    step, k, u, ar, wait_of(x, red));
                fin = ar;
            }
            if (t->cfg->cpu_offload)
                EXPECT(t, unit_slot(x, k, u, D2H)->at > wait_of(x, fin),
                       "step %ld micro %d: d2h of unit %d (#%d) before its gradient reduction completed (#%d)", step, k,
                       u, unit_slot(x, k, u, D2H)->at, wait_of(x, fin));
        }
        if (k == t->K - 1)
            EXPECT(t, x->optim[u].at > wait_of(x, fin),
                   "step %ld: optim of unit %d (#%d) before its gradient reduction completed (#%d)", step, u,
                   x->optim[u].at, wait_of(x, fin));
        if (k == t->K - 1 && fc_rule_norm_reduced(t->api, t->cfg)) {
            EXPECT(t, x->norm.at > wait_of(x, fin),
                   "step %ld: norm all_reduce (#%d) before unit %d's gradient reduction completed (#%d)", step,
                   x->norm.at, u, wait_of(x, fin));
            // without clipping the optimizer does not need the norm
            if (t->cfg->clip_grad_norm > 0)
                EXPECT(t, x->optim[u].at > wait_of(x, x->norm.at),
                       "step %ld: optim of unit %d (#%d) before the norm all_reduce completed (#%d)", step, u,
                       x->optim[u].at, wait_of(x, x->norm.at));
        }
    }
}

// Frees after the unit's last forward stage (where it reshards) and after its
// last backward stage.
static void check_free_order(step_view *x, int k) {
    const theory *t = x->t;
    for (int u = 0; u < t->nu; u++) {
        if (reshards(t, u))
            EXPECT(t, unit_slot(x, k, u, FREE_FWD)->at > fwd_slot(x, k, t->st[u].last_fwd)->at,
                   "step %ld micro %d: forward free of unit %d (#%d) before its last forward compute (#%d)", x->step, k,
                   u, unit_slot(x, k, u, FREE_FWD)->at, fwd_slot(x, k, t->st[u].last_fwd)->at);
        if (frees_in_backward(t, k))
            EXPECT(t, unit_slot(x, k, u, FREE_BWD)->at > bwd_slot(x, k, t->st[u].last_bwd)->at,
                   "step %ld micro %d: backward free of unit %d (#%d) before its last backward compute (#%d)", x->step,
                   k, u, unit_slot(x, k, u, FREE_BWD)->at, bwd_slot(x, k, t->st[u].last_bwd)->at);
    }
}

// Activation checkpointing: a checkpointed unit's recompute runs after the
// forward pass, stage by stage in forward order, before the unit's first
// backward compute. A recompute that gathers the unit frees it after its last
// recompute, before backward gathers it again.
static void check_recompute_order(step_view *x, int k) {
    const theory *t = x->t;
    int fwd_end = fwd_slot(x, k, t->ns - 1)->at;
    for (int u = 0; u < t->nu; u++) {
        if (!t->ckpt[u]) continue;
        int prev = fwd_end, first_bwd = bwd_slot(x, k, t->st[u].first_bwd)->at;
        for (int s = t->st[u].first_fwd; s <= t->st[u].last_fwd; s++) {
            if (unit_of(t, s) != u) continue;
            int r = rec_slot(x, k, s)->at;
            EXPECT(t, r > prev && r < first_bwd,
                   "step %ld micro %d: recompute of stage %d (#%d) expected after #%d (the forward pass, the unit's "
                   "earlier stages) and before unit %d's first backward compute (#%d)",
                   x->step, k, s, r, prev, u, first_bwd);
            prev = r;
        }
        if (!t->rec_gathers[u]) continue;
        int fr = unit_slot(x, k, u, FREE_REC)->at, ag = unit_slot(x, k, u, AG_BWD)->at;
        EXPECT(t, fr > prev && ag > fr && !x->ev[ag].prefetch,
               "step %ld micro %d: unit %d's recompute (last #%d) gathers it itself: expected its free after it "
               "(#%d), then backward's all_gather at need, unflagged (#%d, prefetch=%d)",
               x->step, k, u, prev, fr, ag, x->ev[ag].prefetch);
    }
}

// A position in the step for a message: "#12", or "the start" for -1.
static const char *pos(char buf[24], int i) {
    if (i < 0) return "the start";
    snprintf(buf, 24, "#%d", i);
    return buf;
}

// One prefetchable all-gather, and where the theory lets it be issued.
typedef struct {
    const char *policy;        // the policy, as messages name it: "forward_prefetch", "backward_prefetch pre", ...
    int unit;                  // the unit gathered
    int gather;                // its all_gather's position in the step
    int policy_on;             // the policy applies here: a flagged prefetch in (window_lo, window_hi)
    int window_lo, window_hi;  // the prefetch window, positions both excluded
    int opportunity;           // the position where the limiter decides: it counts the units gathered before it
    int need_after;            // gathered at need (policy off, or held back by the limiter): after this position
} prefetch_case;

// With the policy on, a flagged prefetch in the window. With the limiter, an
// unflagged all-gather is one the limiter held back: allowed only where it
// had to (two units gathered at the opportunity), and then gathered at need.
// The flag decides which, as a held-back unit gathered at need may sit where
// a prefetch could. With the policy off, at need and unflagged.
static void check_prefetch(step_view *x, int k, const prefetch_case *pc) {
    const theory *t = x->t;
    int flagged = x->ev[pc->gather].prefetch, alive = x->alive_before[pc->opportunity];
    char a[24], b[24];
    if (!pc->policy_on) {
        EXPECT(t, pc->gather > pc->need_after && !flagged,
               "step %ld micro %d: %s off: all_gather of unit %d (#%d, prefetch=%d) expected at need, after %s, not "
               "flagged",
               x->step, k, pc->policy, pc->unit, pc->gather, flagged, pos(a, pc->need_after));
    } else if (flagged || !fc_rule_limits_gathered_as(t->api, t->cfg)) {
        EXPECT(t, pc->gather > pc->window_lo && pc->gather < pc->window_hi && flagged,
               "step %ld micro %d: %s: all_gather of unit %d (#%d, prefetch=%d) expected after %s and before #%d, "
               "flagged prefetch",
               x->step, k, pc->policy, pc->unit, pc->gather, flagged, pos(a, pc->window_lo), pc->window_hi);
    } else {
        EXPECT(t, !fc_rule_prefetch_allowed(t->cfg, alive),
               "step %ld micro %d: %s with limit_all_gathers: unit %d not prefetched (after %s, before #%d) although "
               "only %d unit(s) were gathered",
               x->step, k, pc->policy, pc->unit, pos(a, pc->window_lo), pc->window_hi, alive);
        EXPECT(t, pc->gather > pc->need_after,
               "step %ld micro %d: %s with limit_all_gathers: unit %d held back, so expected at need after %s; its "
               "all_gather is #%d",
               x->step, k, pc->policy, pc->unit, pos(b, pc->need_after), pc->gather);
    }
}

// Forward: the unit of stage 0 at need; every other unit v at its
// opportunity p (the stage whose next unit it is): forward_prefetch issues
// it after stage p-1 ended and before stage p's compute; without it, it is
// gathered after stage p ended.
static void check_forward_gathers(step_view *x, int k) {
    const theory *t = x->t;
    if (!gathers_in_forward(t, k)) return;  // still gathered from micro-batch k-1 (FSDP1's ZeRO-2, no_sync)
    for (int v = 0; v < t->nu; v++) {
        int ag = unit_slot(x, k, v, AG_FWD)->at, p = t->fwd_opp[v];
        if (p < 0) {
            EXPECT(t, !x->ev[ag].prefetch,
                   "step %ld micro %d: all_gather of unit %d, the first forward unit, is flagged prefetch", x->step, k,
                   v);
            continue;
        }
        int opp_compute = fwd_slot(x, k, p)->at;  // stage p's compute
        check_prefetch(
            x, k,
            &(prefetch_case){.policy = "forward_prefetch",
                             .unit = v,
                             .gather = ag,
                             .policy_on = fc_rule_forward_prefetches_as(t->api, t->cfg, first_iteration(x, k)),
                             .window_lo = p > 0 ? end_fwd(x, k, p - 1) : -1,
                             .window_hi = opp_compute,
                             .opportunity = opp_compute,
                             .need_after = end_fwd(x, k, p)});
    }
}

// Backward (strategies that reshard after forward): each unit v freed after
// forward is gathered again. Its opportunity p is the backward stage before
// its first backward stage, of unit u. BACKWARD_PRE applies when p is u's
// first backward stage: v's all-gather between the end of stage p+1 (u
// gathered) and p's compute. BACKWARD_POST applies when p is u's last
// backward stage: after p's compute, before u's reduce_scatter. Otherwise, or
// with none, v is gathered at need: after stage p ended and u's gradient
// reduction was issued.
static void check_backward_gathers(step_view *x, int k) {
    const theory *t = x->t;
    int syncs = sync_micro(t, k), fwd_end = end_fwd(x, k, t->ns - 1);
    for (int v = 0; v < t->nu; v++) {
        if (!reshards(t, v)) continue;
        // a recompute that gathers v gathers it first (its free then makes backward gather v again)
        int ag = unit_slot(x, k, v, t->rec_gathers[v] ? AG_REC : AG_BWD)->at, p = t->bwd_opp[v];
        if (p < 0) {  // the first unit backward uses
            EXPECT(t, ag > fwd_end && !x->ev[ag].prefetch,
                   "step %ld micro %d: backward all_gather of unit %d (#%d, prefetch=%d), the first backward unit, "
                   "expected after the forward pass (#%d), not flagged",
                   x->step, k, v, ag, x->ev[ag].prefetch, fwd_end);
            continue;
        }
        int u = unit_of(t, p), opp_compute = bwd_slot(x, k, p)->at;  // stage p's compute
        int pre_opp = p == t->st[u].first_bwd, post_opp = p == t->st[u].last_bwd;
        int rs = post_opp && syncs ? unit_slot(x, k, u, RS)->at : -1;
        int need_lo = end_bwd(x, k, p);
        if (rs > need_lo) need_lo = rs;
        int late = fc_rule_late_post_backward_as(t->api, t->cfg, first_iteration(x, k));
        if (late) need_lo = opp_compute;  // u's free and reduction may come later (rules.h)
        prefetch_case pc = {.policy = "backward_prefetch",
                            .unit = v,
                            .gather = ag,
                            .policy_on = 0,
                            .opportunity = opp_compute,
                            .need_after = need_lo};
        if (t->bwd_prefetch == FC_PREFETCH_PRE && pre_opp) {
            int lo = p + 1 < t->ns ? end_bwd(x, k, p + 1) : fwd_end;
            int own_gather = reshards(t, u) ? unit_slot(x, k, u, AG_BWD)->at : -1;  // u's own gather comes first
            if (own_gather > lo) lo = own_gather;
            pc.policy = "backward_prefetch pre";
            pc.policy_on = 1, pc.window_lo = lo, pc.window_hi = opp_compute;
        } else if (t->bwd_prefetch == FC_PREFETCH_POST && post_opp && !(late && !x->ev[ag].prefetch)) {
            // (late: u's post-backward, which prefetches, may run after v's own
            // pre-backward gathered v at need, unflagged)
            pc.policy = "backward_prefetch post";
            pc.policy_on = 1, pc.window_lo = opp_compute, pc.window_hi = syncs ? rs : bwd_slot(x, k, p - 1)->at;
        }
        check_prefetch(x, k, &pc);
    }
}

void theory_check_order(step_view *x, int k) {
    check_compute_and_reduce_order(x, k);
    check_recompute_order(x, k);
    if (!x->t->g.sharded) return;
    check_free_order(x, k);
    check_forward_gathers(x, k);
    check_backward_gathers(x, k);
}
