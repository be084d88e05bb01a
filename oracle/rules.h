// oracle/rules.h — FSDP's rules written a second time, for the oracle alone.
//
// Why twice: core/layout.c states the rules for the implementations (the
// reference engine and the CUDA port run them), and a theory (P10, P11) that
// asked those same functions what to expect would be wrong on both sides, and
// pass, wherever a rule is wrong. So the oracle states each rule again from
// docs/contract.md §5 and PyTorch's documented semantics, deliberately written
// differently: tables and closed forms, not the engine's scans. Nothing here
// calls core/layout.c; the structs it fills (fc_groups, fc_unit_layout,
// fc_unit_stages) are only data.
//
// fc_rules_disagree() then compares the two writings for one configuration, and
// P10 fails, naming both, wherever they differ: a mutant of core/layout.c is
// caught there even where the numbers and the comm log cannot show it (the
// divide factors' split, for one).
#ifndef FC_ORACLE_RULES_H
#define FC_ORACLE_RULES_H

#include <stddef.h>

#include "config.h"
#include "layout.h"  // the fc_groups / fc_unit_layout / fc_unit_stages structs only
#include "model.h"
#include "findings.h"  // fc_findings, fc_sched_api

// One row of docs/contract.md §5's strategy table.
typedef struct {
    fc_strategy strategy;
    int gathers;          // parameters are all-gathered before use (sharded)
    int frees_after_fwd;  // ZeRO-3: a unit's gathered parameters are freed after forward
    int hybrid;           // shard groups of F ranks, replicas all-reduce the shard
} fc_rule_row;

const fc_rule_row *fc_rule_row_of(fc_strategy s);

// The groups, by docs/contract.md §5's closed forms (F, R = W/F, consecutive groups).
fc_groups fc_rule_groups(const fc_run_config *cfg, int W, int rank);
// A unit's flat layout: S = N / G rounded up, P = S G, chunk idx at idx S.
fc_unit_layout fc_rule_layout(size_t numel, const fc_groups *g);
// The stages of unit u in forward (first, last), and backward's mirror.
fc_unit_stages fc_rule_stages(const fc_model *m, int u);
// Whether unit u is freed after forward (the root never is: backward uses it
// at once, FSDP1 keeps it unsharded).
int fc_rule_frees_after_forward(fc_strategy s, const fc_model *m, int u);
// Activation checkpointing, docs/contract.md §5: every unit but the root recomputes its
// forward in backward once per micro-batch.
int fc_rule_checkpointed(const fc_run_config *cfg, const fc_model *m, int u);
// The recompute's own all-gather (and free): only FSDP1 with the checkpoint
// outside the unit, of a unit freed after forward. Inside, and under FSDP2
// whose pre-forward leaves a unit in backward gathered, the recompute runs on
// backward's all-gather.
int fc_rule_recompute_gathers(const fc_run_config *cfg, const fc_model *m, int u);
// Real FSDP's measured divergences from docs/contract.md §5 (torch 2.15), each for one
// API alone (docs/adapter.md, "Real FSDP's schedule"); for FC_API_REFERENCE each is the
// rule above.
//  - FSDP2 frees the root unit after forward too (reshard_after_forward on the
//    root's fully_shard), and gathers it again first in backward.
int fc_rule_frees_after_forward_as(fc_sched_api api, fc_strategy s, const fc_model *m, int u);
//  - FSDP2 shards each parameter on dim 0 (a DTensor Shard(0)), each padded to
//    a multiple of F: one rank's shard of unit u holds sum_p ceil(d0_p / F) *
//    numel_p / d0_p elements, and the all-gather moves F of them.
size_t fc_rule_fsdp2_shard(const fc_model *m, int u, int F);
//    Of them, shard rank j's real elements are its torch.chunk rows, [j*c,
//    min((j+1)*c, d0)) with c = ceil(d0 / F), of every parameter.
size_t fc_rule_fsdp2_valid(const fc_model *m, int u, int F, int j);
// Elements of unit u that rank g->idx holds for frozen parameters: their
// real elements in its flat chunk (FSDP1; the whole unit unsharded), or
// their rows (per_param, FSDP2): padded (what it stores: for FSDP1 the whole
// chunk, padding included, when no parameter of the unit trains) or real
// (what it would step). Optimizer state counts the rest of the padded count;
// FSDP2's gradient too. core/layout.c's fc_unit_frozen_store is checked
// against the padded count.
size_t fc_rule_frozen_store(const fc_model *m, int u, const fc_groups *g, int per_param, int padded);
// Whether a parameter of unit u trains (is not frozen): else the unit has no
// gradient, reduces nothing and keeps no optimizer state.
int fc_rule_unit_trains(const fc_model *m, int u);
//  - FSDP1 keeps the parameters of a strategy that does not free after forward
//    (SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2) gathered through a no_sync
//    micro-batch's backward: no free there, and no all-gather in the next
//    micro-batch's forward (FSDP1's _should_free_in_backward).
int fc_rule_keeps_through_no_sync(fc_sched_api api, fc_strategy s);
//  - The total norm's all_reduce: the reference computes the norm every step
//    (its trace records it); a torch loop only when it clips, and not under
//    no_shard, where every rank holds the whole gradient (FSDP1's
//    clip_grad_norm_ falls back to torch's local one).
int fc_rule_norm_reduced(fc_sched_api api, const fc_run_config *cfg);
//  - FSDP2 always prefetches one unit ahead in backward (its implicit
//    prefetch): backward_prefetch none runs as pre there.
fc_prefetch fc_rule_backward_prefetch_as(fc_sched_api api, const fc_run_config *cfg);
//  - FSDP1 forward-prefetches by the order it recorded in its first forward:
//    the first micro-batch of the process's first step gathers at need.
int fc_rule_forward_prefetches_as(fc_sched_api api, const fc_run_config *cfg, int first_iteration);
//  - Once FSDP1 forward-prefetches, a unit's post-backward (its free and
//    reduce_scatter) may come after the next unit's pre-backward: the prefetch
//    made the unit's parameter views before the previous unit's compute, so
//    autograd, which runs later-made nodes first, accumulates that unit's
//    gradient (FSDP1's post-backward hook is on its AccumulateGrad) only after
//    it reached the previous unit. An at-need backward all-gather then follows
//    the compute of the stage before it, not that stage's free and reduction.
int fc_rule_late_post_backward_as(fc_sched_api api, const fc_run_config *cfg, int first_iteration);
//  - Activation checkpointing outside the unit: torch's checkpoint_wrapper
//    (NO_REENTRANT, the adapter's and apply_activation_checkpointing's
//    default) recomputes when autograd first unpacks a saved tensor, after
//    the unit's pre-backward hook has gathered it, so FSDP1's _pre_forward
//    finds it unsharded and the recompute gathers nothing (measured, torch
//    2.15: test_schedule.py's fsdp1-act_ckpt-outside); FSDP2 never does. The
//    reference states FSDP1's second all-gather (docs/contract.md §5), which a
//    REENTRANT checkpoint_wrapper does pay (measured: 4 backward all-gathers
//    against 2 for two checkpointed FSDP1 blocks, docs/adapter.md).
int fc_rule_recompute_gathers_as(fc_sched_api api, const fc_run_config *cfg, const fc_model *m, int u);
//  - FSDP1's limit_all_gathers bounds device work, not units gathered: before
//    an all-gather it waits (CPU thread) for the free event of the all-gather
//    two back (_FreeEventQueue); in issue order a third unit may be gathered,
//    and without device events (gloo on CPU) it waits for nothing. docs/contract.md §5's
//    bound (at most two units gathered) is the reference's; FSDP2 has none.
int fc_rule_limits_gathered_as(fc_sched_api api, const fc_run_config *cfg);
//  - The norm's bytes: 4 or 8 (one fp32 or fp64 partial), or 88, the exact
//    partial of core/clip.h that the reference and the CUDA port send; under FSDP2 torch's clip_grad_norm_ all-reduces the DTensor partial
//    norms of every parameter at once, 4 bytes each.
int fc_rule_norm_bytes_ok(fc_sched_api api, const fc_model *m, size_t bytes);

// Prefetch opportunities, docs/contract.md §5: forward_prefetch issues unit i+1's
// all-gather at unit i's forward, units in order of first forward use;
// backward prefetch issues the all-gather of the unit backward reaches next at
// the stage where backward reaches the current one. FSDP2's explicit lists of
// D units (set_modules_to_*_prefetch of the next D, on every unit) move unit
// i's opportunity to unit i - D's (unit 0's for i <= D): the first list that
// names it, as torch's unshard of a unit in flight does nothing. fwd[u] /
// bwd[u]: the stage whose window may prefetch unit u, -1 for the first unit of
// each pass. fc_rule_prefetch_depth: D of a run's forward (forward = 1) or
// backward lists, 1 without lists.
int fc_rule_prefetch_depth(const fc_run_config *cfg, int forward);
void fc_rule_opportunities(const fc_model *m, int fwd_depth, int bwd_depth, int *fwd, int *bwd);
// limit_all_gathers: at most two units' parameters gathered at once, so a
// prefetch may go only if it makes at most two.
int fc_rule_prefetch_allowed(const fc_run_config *cfg, int alive);
// The divide factors (pre, post) of a divide mode for a divide factor F (W
// ranks, or FSDP2's set_gradient_divide_factor; a fractional F: pre 1). prepost is
// PyTorch FSDP1's _get_gradient_predivide_factor in closed form:
// pre = 2^min(v2(W) + 1, ceil(log4 W)), post = W / pre.
void fc_rule_divide(fc_divide d, double F, double *pre, double *post);
// Data-parallel rank r's samples: the r-th of W equal, consecutive slices.
void fc_rule_samples(const fc_run_config *cfg, int W, int rank, int *first, int *count);

// Compares core/layout.c with these rules for cfg at world W, seen from rank:
// every rule the reference and the CUDA port run. Adds one finding per
// disagreement ("core/layout.c says ..., the oracle's rules say ...") and
// returns their number.
int fc_rules_disagree(const fc_run_config *cfg, int W, int rank, fc_findings *out);

#endif
