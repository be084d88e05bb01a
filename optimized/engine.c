// optimized/engine.c — the CUDA port's FSDP engine. See engine.h.
//
// One training step, top to bottom (the reference's, reference/fsdp.c):
//   1. this rank's slice of the global batch (core/data.h) goes to the device;
//   2. forward, stage by stage: a unit's parameters are all-gathered (on the
//      COMM stream) before its first stage runs, earlier with forward_prefetch,
//      and freed after its last forward stage when the strategy reshards;
//   3. backward in reverse: gathered again if freed, the unsharded gradient
//      (param_dtype) accumulates, and after the unit's last backward stage it
//      is pre-divided into reduce_dtype and reduced (reduce-scatter, or
//      all-reduce for no_shard, then the replica all-reduce for hybrid), and
//      post-divided into the fp32 gradient shard;
//   4. clip_grad_norm over the owned gradient elements (core/clip.h), then the
//      optimizer over this rank's shard (core/optim.h), on the device or, under
//      cpu_offload, on the host.
// Frozen parameters (--freeze, LoRA's base; docs/contract.md §2) as FSDP keeps them: a
// unit with no trainable parameter has no gradient shard, computes no
// parameter gradient and reduces nothing; in a unit that trains, the unit's
// whole gradient is reduced (FSDP1's FlatParameter) and only the trainable
// elements' part is accumulated, normed and stepped. Optimizer state, and
// under FSDP2 the gradient shard too, is kept for what trains only: one array
// with the frozen parameters' stretches of the store left out
// (core/layout.h fc_unit_frozen_slots).
// Every collective, wait, compute, free, copy and optimizer step is logged
// where it is issued (core/schedule.h), with the reference's vocabulary and
// bytes. Streams (exec.h): a gather's pack and collective run on COMM; the
// compute stream waits for it only where the unit is first needed, so a
// prefetched gather overlaps the compute issued before that wait.
//
// `local` (one process, the whole batch) runs the no_shard path with no
// collective and an empty comm log.
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "ckpt_collective.h"
#include "clip.h"
#include "init.h"
#include "mpicheck.h"
#include "optim.h"
#include "weights.h"

// A run of this rank's stored elements that is all frozen or all trainable:
// param[off, off + count), and for a trainable run its optimizer state at
// state[i][state_off, state_off + count).
typedef struct {
    size_t off, count, state_off;
    int frozen;
} cu_run;

typedef struct {
    size_t numel, shard, padded, own_off, own_valid, store;  // fc_unit_layout_in
    size_t gathered_numel;  // the compute buffer: P in FSDP1's flat order (padding at the end), N in FSDP2's
    fc_piece *own;       // [n_own] where this rank's chunk's real elements sit in the unit (core/layout.h);
    int n_own;           // no_shard: the whole unit, one piece
    int trains;          // some parameter of the unit trains (core/model.h fc_unit_trains)
    cu_run *runs;        // [n_runs] the real elements this rank owns (its chunk's pieces; no_shard: all), in order
    int n_runs;
    fc_piece *fz;        // [n_fz] the frozen parameters' stretches of the store (fc_unit_frozen_slots)
    int n_fz;
    size_t state_n;      // elements of each optimizer state: store less the frozen stretches; 0 when !trains
    int grad_compact;    // the gradient shard leaves the frozen stretches out too (FSDP2), as the state does
    float *param;        // [store] fp32 master parameters (device, or pinned host under cpu_offload)
    float *grad;         // [store] fp32 (grad_compact: [state_n]) reduced gradient, accumulated over
                         //   micro-batches; NULL when !trains
    float *state[2];     // [state_n] optimizer state, the frozen stretches left out; NULL when state_n is 0
    void *gathered;      // [gathered_numel] sharded, [N] no_shard: compute parameters in param_dtype; NULL when freed
    int gathered_owned;  // gathered is an allocation (not param itself: no_shard in fp32)
    int ag_pending;      // its all-gather is in flight
    fcx_req ag_req;
    void *ag_send;       // [S] param_dtype: the packed shard the all-gather sends (or the post-forward slice)
    void *ag_wire;       // [P] param_dtype: FSDP2's all-gather output in wire order, copied out at the wait
    void *pf_slice;      // [P / PF] param_dtype: FSDP2's integer reshard_after_forward keeps this between
    int ag_from_slice;   //   forward and backward; the all-gather in flight rebuilds from it (POST_FORWARD)
    void *full_grad;     // [gathered_numel] param_dtype: the unsharded gradient, first backward stage to reduction
    int reshard_after_forward;
} cu_unit;

struct fce {
    fc_run_config cfg;
    fc_model m;
    fce_comms c;
    fc_groups g;
    int local;           // strategy local: no collectives, no log
    fcx *x;
    const fc_layout_ops *lay;  // FSDP1's flat chunks or FSDP2's per-parameter rows (core/layout.h)
    float pre, post;     // gradient divide factors (core/layout.h)
    cu_unit *u;          // [n_units]
    fc_unit_stages *st;  // [n_units]
    int *prefetch_list;  // [n_units] scratch: the units one prefetch call issues
    int alive;           // units whose gathered parameters exist (sharded)
    int rs_unit;         // the reduction in flight, -1 if none
    fcx_req rs_req;
    void *rs_send;       // [P] reduce_dtype: pre-divided gradient (no_shard: reduced in place)
    void *rs_out;        // [S] reduce_dtype: this rank's reduced chunk (sharded)
    fc_batch batch;      // this rank's samples of the step (host)
    int micro, rows;     // samples and rows (samples * T) per micro-batch
    void **up, **ug;     // [n_units] stage parameter / gradient tables
    int n_state;
    const char *state_names[2];
    long step;
    fc_comm_log log;
};

void fce_comms_make(const fc_run_config *cfg, MPI_Comm comm, fce_comms *c) {
    int W, rank;
    mpiCheck(MPI_Comm_size(comm, &W));
    mpiCheck(MPI_Comm_rank(comm, &rank));
    c->g = fc_groups_of(cfg, W, rank);
    fc_mpi_layout_comms(comm, c->g.G, &c->world, &c->shard, &c->replica);
    c->post_fwd = MPI_COMM_NULL;  // FSDP2's integer reshard_after_forward: PF consecutive ranks
    if (c->g.PF) fc_mpi_comm_split(comm, rank / c->g.PF, rank, &c->post_fwd);
}

void fce_comms_free(fce_comms *c) {
    if (c->world == MPI_COMM_NULL) return;
    if (c->post_fwd != MPI_COMM_NULL) mpiCheck(MPI_Comm_free(&c->post_fwd));
    mpiCheck(MPI_Comm_free(&c->shard));
    mpiCheck(MPI_Comm_free(&c->replica));
    mpiCheck(MPI_Comm_free(&c->world));
    c->world = MPI_COMM_NULL;
}

// Every rank returns the same verdict: on failure, the lowest failing rank's
// message (collective over the world).
// ---------------------------------------------------------------------------
// the comm log

static void log_ev(fce *f, fc_op op, fc_op of, int unit, int stage, fc_group g, size_t bytes, fc_prec dt, fc_phase ph,
                   int prefetch) {
    if (f->local) return;  // one process: nothing scheduled, nothing logged
    fc_log_event(&f->log, op, of, unit, stage, g, bytes, dt, ph, prefetch);
}

// ---------------------------------------------------------------------------
// all-gather, free, prefetch

// The group unit u's next all-gather runs over: the shard group, or, for a
// unit holding its post-forward slice, that slice's group of PF ranks.
static fc_group gather_group(const cu_unit *U) {
    return U->pf_slice || U->ag_from_slice ? FC_GROUP_POST_FORWARD : FC_GROUP_SHARD;
}

static void issue_all_gather(fce *f, int u, fc_phase ph, int prefetch) {
    cu_unit *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    size_t pb = fc_prec_size(pd);
    fc_group grp = gather_group(U);
    if (f->cfg.cpu_offload)  // the fp32 shard comes to the device: the pack reads it from pinned host memory
        log_ev(f, FC_OP_H2D, FC_OP_H2D, u, -1, FC_GROUP_NONE, U->shard * sizeof(float), FC_PREC_FP32, ph, 0);
    U->gathered = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, U->gathered_numel * pb, FCX_COMM);
    U->gathered_owned = 1;
    // FSDP1's flat order gathers straight into the compute buffer; FSDP2's
    // rank-major rows into a wire buffer, copied out at the wait
    void *recv = U->gathered;
    if (!f->lay->wire_is_natural)
        recv = U->ag_wire = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->padded * pb, FCX_COMM);
    if (U->pf_slice) {  // the PF slices kept after forward are the wire order's consecutive blocks
        U->ag_send = U->pf_slice;
        U->pf_slice = NULL;
        U->ag_from_slice = 1;
        fcx_all_gather(f->x, FCX_GROUP_POST_FORWARD, U->ag_send, recv, U->padded / (size_t)f->g.PF, pd, &U->ag_req);
    } else {
        U->ag_send = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->shard * pb, FCX_COMM);
        fcx_cast(f->x, U->ag_send, pd, U->param, U->shard, FCX_COMM);
        // 16-bit gathers send 16-bit data
        fcx_all_gather(f->x, FCX_GROUP_SHARD, U->ag_send, recv, U->shard, pd, &U->ag_req);
    }
    U->ag_pending = 1;
    f->alive++;
    log_ev(f, FC_OP_ALL_GATHER, FC_OP_ALL_GATHER, u, -1, grp, U->padded * pb, pd, ph, prefetch);
}

static void wait_all_gather(fce *f, int u, fc_phase ph) {
    cu_unit *U = &f->u[u];
    fc_group grp = gather_group(U);
    fcx_wait(f->x, &U->ag_req);  // COMPUTE now runs after the gather
    if (U->ag_wire) {  // copy-out: each chunk's pieces to their place in the unit
        fcx_permute(f->x, u, U->gathered, U->ag_wire, 0, f->cfg.param_dtype, FCX_COMPUTE);
        fcx_free(f->x, U->ag_wire, FCX_COMPUTE);
        U->ag_wire = NULL;
    }
    // its uses (pack, collective) were all on COMM
    fcx_free(f->x, U->ag_send, FCX_COMM);
    U->ag_send = NULL;
    U->ag_from_slice = 0;
    U->ag_pending = 0;
    log_ev(f, FC_OP_WAIT, FC_OP_ALL_GATHER, u, -1, grp, 0, f->cfg.param_dtype, ph, 0);
}

// Makes unit u's compute parameters available to COMPUTE.
static void ensure_gathered(fce *f, int u, fc_phase ph) {
    cu_unit *U = &f->u[u];
    if (!f->g.sharded) {
        if (U->gathered) return;
        if (f->cfg.param_dtype == FC_PREC_FP32) {
            U->gathered = U->param;  // DDP computes on its own full copy
            U->gathered_owned = 0;
        } else {  // a param_dtype compute copy, as DDP under mixed precision
            U->gathered = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, U->numel * fc_prec_size(f->cfg.param_dtype),
                                    FCX_COMPUTE);
            U->gathered_owned = 1;
            fcx_cast(f->x, U->gathered, f->cfg.param_dtype, U->param, U->numel, FCX_COMPUTE);
        }
        return;
    }
    if (!U->gathered) issue_all_gather(f, u, ph, 0);
    if (U->ag_pending) wait_all_gather(f, u, ph);
}

// FSDP2's integer reshard_after_forward: before unit u's gathered parameters
// are freed after forward, this rank keeps block pf_rank of PF of the wire
// order (torch's to_sharded_post_forward narrows each parameter's all-gather
// output the same way), so that backward's all-gather over the PF ranks
// rebuilds the unit with the same bits.
static void keep_post_forward_slice(fce *f, int u) {
    cu_unit *U = &f->u[u];
    fc_prec pd = f->cfg.param_dtype;
    size_t pb = fc_prec_size(pd), n = U->padded / (size_t)f->g.PF;
    void *wire = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, U->padded * pb, FCX_COMPUTE);  // [P] padding 0
    fcx_permute(f->x, u, U->gathered, wire, 1, pd, FCX_COMPUTE);
    U->pf_slice = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, n * pb, FCX_COMPUTE);
    fcx_copy(f->x, U->pf_slice, (char *)wire + (size_t)f->g.pf_rank * n * pb, n * pb, FCX_COMPUTE);
    fcx_free(f->x, wire, FCX_COMPUTE);
    fcx_order(f->x, FCX_COMM, FCX_COMPUTE);  // backward's all-gather (COMM) sends the slice
}

static void free_gathered(fce *f, int u, fc_phase ph) {
    cu_unit *U = &f->u[u];
    if (!U->gathered) return;
    if (f->g.PF && ph == FC_PHASE_FORWARD) keep_post_forward_slice(f, u);
    // every use is on COMPUTE, which waited for the gather that wrote it
    if (U->gathered_owned) fcx_free(f->x, U->gathered, FCX_COMPUTE);
    if (f->g.sharded) {
        f->alive--;
        log_ev(f, FC_OP_FREE, FC_OP_FREE, u, -1, FC_GROUP_NONE, 0, f->cfg.param_dtype, ph, 0);
    }
    U->gathered = NULL;
    U->gathered_owned = 0;
}

// Issues unit v's all-gather ahead of need; with limit_all_gathers only while
// fewer than two units' gathered parameters exist (core/layout.h).
static void prefetch(fce *f, int v, fc_phase ph) {
    if (v < 0 || !f->g.sharded || f->u[v].gathered) return;
    if (!fc_limiter_allows_prefetch(&f->cfg, f->alive)) return;
    issue_all_gather(f, v, ph, 1);
}

// The prefetches stage s makes (core/layout.h): FSDP1's next unit, or FSDP2's
// list of the next n units of the pass.
static void prefetch_from(fce *f, int s, int forward, int n) {
    int k = fc_prefetch_units(&f->m, f->st, s, forward, n, f->prefetch_list);
    for (int i = 0; i < k; i++) prefetch(f, f->prefetch_list[i], forward ? FC_PHASE_FORWARD : FC_PHASE_BACKWARD);
}

// ---------------------------------------------------------------------------
// gradient reduction (one in flight, as FSDP's post-backward stream)

// Where trainable run R's gradient is: at its store offset, or in a compact
// gradient (FSDP2 with frozen parameters) where its state is.
static float *grad_of(const cu_unit *U, const cu_run *R) {
    return U->grad + (U->grad_compact ? R->state_off : R->off);
}

// Finishes the reduction in flight: the replica all-reduce (hybrid), the
// post-divide and the accumulation into the fp32 gradient shard.
static void complete_reduce(fce *f) {
    int u = f->rs_unit;
    if (u < 0) return;
    cu_unit *U = &f->u[u];
    fc_prec rd = f->cfg.reduce_dtype;
    size_t rb = fc_prec_size(rd), S = U->shard;
    if (!f->local) fcx_wait(f->x, &f->rs_req);
    if (f->g.sharded) {
        log_ev(f, FC_OP_WAIT, FC_OP_REDUCE_SCATTER, u, -1, FC_GROUP_SHARD, 0, rd, FC_PHASE_BACKWARD, 0);
        if (f->g.hybrid && f->g.R > 1) {
            log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_REPLICATE, S * rb, rd, FC_PHASE_BACKWARD, 0);
            fcx_req r = {0};
            fcx_all_reduce(f->x, FCX_GROUP_REPLICA, f->rs_out, S, rd, &r);
            fcx_wait(f->x, &r);
            log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_REPLICATE, 0, rd, FC_PHASE_BACKWARD, 0);
        }
        // padding never reaches the gradient, nor does a frozen parameter's
        // share: only the chunk's trainable runs
        for (int k = 0; k < U->n_runs; k++) {
            const cu_run *R = &U->runs[k];
            if (!R->frozen)
                fcx_accumulate(f->x, grad_of(U, R), (char *)f->rs_out + R->off * rb, rd, R->count, f->post,
                               FCX_COMPUTE);
        }
    } else {
        log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_WORLD, 0, rd, FC_PHASE_BACKWARD, 0);
        for (int k = 0; k < U->n_runs; k++) {  // no_shard: the runs are the whole unit's
            const cu_run *R = &U->runs[k];
            if (!R->frozen)
                fcx_accumulate(f->x, U->grad + R->off, (char *)f->rs_send + R->off * rb, rd, R->count, f->post,
                               FCX_COMPUTE);
        }
    }
    if (f->cfg.cpu_offload)  // the accumulation wrote the fp32 gradient shard into pinned host memory
        log_ev(f, FC_OP_D2H, FC_OP_D2H, u, -1, FC_GROUP_NONE, U->own_valid * sizeof(float), FC_PREC_FP32,
               FC_PHASE_BACKWARD, 0);
    // COMPUTE waited for the collective: every use of both buffers is behind it
    fcx_free(f->x, f->rs_send, FCX_COMPUTE);
    if (f->rs_out) fcx_free(f->x, f->rs_out, FCX_COMPUTE);
    f->rs_send = f->rs_out = NULL;
    f->rs_unit = -1;
}

// Starts reducing unit u's unsharded gradient: pre-divide into reduce_dtype
// on COMPUTE, free the unsharded gradient, then the collective on COMM.
static void issue_reduce(fce *f, int u) {
    complete_reduce(f);
    cu_unit *U = &f->u[u];
    fc_prec rd = f->cfg.reduce_dtype;
    size_t rb = fc_prec_size(rd), S = U->shard, P = U->padded;
    fc_prec pd = f->cfg.param_dtype;
    // copy-in: FSDP2's gradient goes to the rank-major wire order, padding zeroed
    void *wire = U->full_grad;
    if (!f->lay->wire_is_natural) {
        wire = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * fc_prec_size(pd), FCX_COMPUTE);
        fcx_permute(f->x, u, U->full_grad, wire, 1, pd, FCX_COMPUTE);
    }
    f->rs_send = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, P * rb, FCX_COMPUTE);
    fcx_predivide(f->x, f->rs_send, rd, wire, pd, P, f->pre, FCX_COMPUTE);
    if (wire != U->full_grad) fcx_free(f->x, wire, FCX_COMPUTE);
    fcx_free(f->x, U->full_grad, FCX_COMPUTE);
    U->full_grad = NULL;
    f->rs_unit = u;
    if (f->local) return;  // one process: the pre-divided gradient is the reduced one
    fcx_order(f->x, FCX_COMM, FCX_COMPUTE);  // the collective reads what COMPUTE wrote
    if (f->g.sharded) {
        f->rs_out = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_COMM_BUFFERS, S * rb, FCX_COMM);
        fcx_reduce_scatter(f->x, FCX_GROUP_SHARD, f->rs_send, f->rs_out, S, rd, &f->rs_req);
        log_ev(f, FC_OP_REDUCE_SCATTER, FC_OP_REDUCE_SCATTER, u, -1, FC_GROUP_SHARD, P * rb, rd, FC_PHASE_BACKWARD, 0);
    } else {
        fcx_all_reduce(f->x, FCX_GROUP_SHARD, f->rs_send, P, rd, &f->rs_req);  // no_shard: the shard group is the world
        log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, u, -1, FC_GROUP_WORLD, P * rb, rd, FC_PHASE_BACKWARD, 0);
    }
}

// ---------------------------------------------------------------------------
// one micro-batch

static void forward(fce *f, int k) {
    const fc_model *m = &f->m;
    float scale = 1.0f / (float)f->rows / (float)f->cfg.grad_accum;  // d loss / d row loss
    for (int s = 0; s < m->n_stages; s++) {
        int u = m->stages[s].unit;
        cu_unit *U = &f->u[u];
        if (s == f->st[u].first_fwd) {
            ensure_gathered(f, u, FC_PHASE_FORWARD);
            // FSDP's forward prefetch: the next units' all-gathers go out before this compute
            prefetch_from(f, s, 1, fc_forward_prefetch_count(&f->cfg));
        }
        log_ev(f, FC_OP_FORWARD, FC_OP_FORWARD, u, s, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_FORWARD, 0);
        f->up[u] = U->gathered;
        fcx_forward(f->x, s, k, f->up, scale);
        f->up[u] = NULL;
        if (s == f->st[u].last_fwd && U->reshard_after_forward) free_gathered(f, u, FC_PHASE_FORWARD);
    }
}

static void backward(fce *f, int k, int sync) {
    const fc_model *m = &f->m;
    size_t pb = fc_prec_size(f->cfg.param_dtype);
    for (int s = m->n_stages - 1; s >= 0; s--) {
        int u = m->stages[s].unit;
        cu_unit *U = &f->u[u];
        if (s == f->st[u].first_bwd) {
            ensure_gathered(f, u, FC_PHASE_BACKWARD);
            if (!U->full_grad && U->trains) {  // survives across micro-batches under no_sync
                size_t n = U->gathered_numel;
                U->full_grad = fcx_alloc(f->x, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, n * pb, FCX_COMPUTE);
                fcx_zero(f->x, U->full_grad, n * pb, FCX_COMPUTE);
            }
            // BACKWARD_PRE: the next unit's all-gather goes out before this gradient compute
            if (fc_backward_prefetch_of(&f->cfg) == FC_PREFETCH_PRE)
                prefetch_from(f, s, 0, fc_backward_prefetch_count(&f->cfg));
        }
        log_ev(f, FC_OP_BACKWARD, FC_OP_BACKWARD, u, s, FC_GROUP_NONE, 0, f->cfg.param_dtype, FC_PHASE_BACKWARD, 0);
        f->up[u] = U->gathered;
        f->ug[u] = U->full_grad;  // NULL for a unit that does not train: input gradients only
        fcx_backward(f->x, s, k, f->up, f->ug);
        f->up[u] = NULL;
        f->ug[u] = NULL;
        if (s == f->st[u].last_bwd) {
            // BACKWARD_POST: after this gradient compute, before its reduction
            if (fc_backward_prefetch_of(&f->cfg) == FC_PREFETCH_POST)
                prefetch_from(f, s, 0, fc_backward_prefetch_count(&f->cfg));
            free_gathered(f, u, FC_PHASE_BACKWARD);
            if (sync && U->trains) issue_reduce(f, u);  // a unit that does not train reduces nothing
        }
    }
    complete_reduce(f);
}

// ---------------------------------------------------------------------------
// clip_grad_norm and the optimizer

// Total gradient norm: each rank's exact partial over its own chunk of every
// unit (no_shard: the chunk it would own sharded over W), gathered over the
// shard group and combined exactly (core/clip.h).
static double grad_norm(fce *f) {
    int nu = f->m.n_units, G = f->g.G, k = 0, cap = 1;
    for (int u = 0; u < nu; u++) cap += f->u[u].n_runs;
    float **g = mallocCheck((size_t)cap * sizeof *g);
    size_t *n = mallocCheck((size_t)cap * sizeof *n);
    for (int u = 0; u < nu; u++) {
        const cu_unit *U = &f->u[u];
        if (!U->grad) continue;  // no gradient: nothing to norm
        if (!f->g.sharded) {  // the chunk it would own sharded over W (frozen elements hold 0)
            g[k] = U->grad + U->own_off;
            n[k++] = U->own_valid;
            continue;
        }
        for (int q = 0; q < U->n_runs; q++) {  // padding and frozen parameters are never normed
            if (U->runs[q].frozen) continue;
            g[k] = grad_of(U, &U->runs[q]);
            n[k++] = U->runs[q].count;
        }
    }
    fc_norm_part part;
    fcx_norm_part(f->x, g, n, k, f->cfg.norm_type, f->cfg.cpu_offload, &part);
    fc_norm_part *parts = mallocCheck((size_t)G * sizeof *parts);
    fc_group grp = f->g.sharded ? FC_GROUP_SHARD : FC_GROUP_WORLD;
    log_ev(f, FC_OP_ALL_REDUCE, FC_OP_ALL_REDUCE, -1, -1, grp, sizeof part, FC_PREC_FP32, FC_PHASE_CLIP, 0);
    if (f->local)
        parts[0] = part;
    else
        fcx_gather_norm_parts(f->x, &part, parts);
    log_ev(f, FC_OP_WAIT, FC_OP_ALL_REDUCE, -1, -1, grp, 0, FC_PREC_FP32, FC_PHASE_CLIP, 0);
    double total = fc_grad_norm_combine(parts, G, f->cfg.norm_type);
    free(parts);
    free(g);
    free(n);
    return total;
}

// The optimizer over this rank's own trainable elements, one buffer per
// trainable run, the clip coefficient applied on the way in (the stored
// gradient stays unclipped for export). The log counts what was stepped.
static void optimizer_step(fce *f, float coef) {
    int nb = 0;
    for (int u = 0; u < f->m.n_units; u++) nb += f->u[u].n_runs;
    size_t cap = nb ? (size_t)nb : 1;
    float **p = mallocCheck(cap * sizeof *p), **g = mallocCheck(cap * sizeof *g);
    float **s0 = mallocCheck(cap * sizeof *s0), **s1 = mallocCheck(cap * sizeof *s1);
    size_t *n = mallocCheck(cap * sizeof *n);
    int k = 0;
    for (int u = 0; u < f->m.n_units; u++) {
        cu_unit *U = &f->u[u];
        size_t stepped = 0;
        for (int r = 0; r < U->n_runs; r++) {
            const cu_run *R = &U->runs[r];
            if (R->frozen) continue;
            p[k] = U->param + R->off;
            g[k] = grad_of(U, R);
            s0[k] = U->state[0] ? U->state[0] + R->state_off : NULL;
            s1[k] = U->state[1] ? U->state[1] + R->state_off : NULL;
            n[k++] = R->count;
            stepped += R->count;
        }
        log_ev(f, FC_OP_OPTIM, FC_OP_OPTIM, u, -1, FC_GROUP_NONE, stepped * sizeof(float), FC_PREC_FP32, FC_PHASE_OPTIM, 0);
    }
    fcx_optim(f->x, &f->cfg.optim, f->step, coef, fc_clip_applies(f->cfg.clip_grad_norm, coef), p, g, s0, s1, n, k,
              f->cfg.cpu_offload);
    fcx_order(f->x, FCX_COMM, FCX_COMPUTE);  // the next gathers pack the updated shards
    free(p);
    free(g);
    free(s0);
    free(s1);
    free(n);
}

int fce_step(fce *f, fc_step_info *out, fc_error *e) {
    const fc_run_config *c = &f->cfg;
    fc_log_begin_step(&f->log, f->step);
    for (int u = 0; u < f->m.n_units; u++) {
        size_t bytes = f->u[u].store * sizeof(float);
        if (!f->u[u].grad) continue;
        if (f->u[u].grad_compact) bytes = f->u[u].state_n * sizeof(float);
        if (c->cpu_offload)
            memset(f->u[u].grad, 0, bytes);  // pinned host; the device is idle between steps
        else
            fcx_zero(f->x, f->u[u].grad, bytes, FCX_COMPUTE);
    }
    // this rank's samples of the global batch: [r B/W, (r+1) B/W)
    int first, count;
    fc_rank_samples(c, f->g.W, f->g.rank, &first, &count);
    fc_data_fill(&f->batch, &c->model, c->seed, f->step, (int64_t)first);
    fcx_set_batch(f->x, &f->batch);
    for (int k = 0; k < c->grad_accum; k++) {
        f->log.micro = k;
        forward(f, k);
        // with no_sync, only the last micro-batch communicates gradients
        backward(f, k, !c->no_sync || k == c->grad_accum - 1);
    }
    fcx_sync(f->x);  // the losses, and under cpu_offload the host gradients, are complete
    double loss = 0;
    for (int k = 0; k < c->grad_accum; k++) loss += fcx_loss_sum(f->x, k) / (float)f->rows;
    double norm = grad_norm(f);
    float coef = c->clip_grad_norm > 0 ? fc_clip_coef(c->clip_grad_norm, norm) : 1.0f;
    f->step++;
    optimizer_step(f, coef);
    fcx_sync(f->x);
    // the reported loss is a metric, not part of FSDP: kept out of the comm log
    double local_loss = loss / c->grad_accum, global_loss = 0;
    mpiCheck(MPI_Allreduce(&local_loss, &global_loss, 1, MPI_DOUBLE, MPI_SUM, f->c.world));
    out->loss = (float)(global_loss / f->g.W);
    out->grad_norm = norm;
    return fc_mpi_agree(f->c.world, fcx_crosscheck(f->x, e) == 0, e);
}

// ---------------------------------------------------------------------------
// create / export / destroy

// The initial values of this rank's stored elements of unit u (host [store]):
// counter-based init is a pure function of (seed, name, index), so each rank
// makes only its own pieces; from a file, the rank keeps its range.
static void init_unit(const fce *f, int u, const float *from_file, float *out) {
    const cu_unit *U = &f->u[u];
    for (int q = 0; q < U->n_own; q++)
        fc_init_unit_range(&f->m, u, f->cfg.seed, from_file, U->own[q].unit_off, U->own[q].unit_off + U->own[q].count,
                           out + U->own[q].chunk_off);
}

// Unit u's frozen stretches, and its runs over the real elements this rank
// owns (its chunk's pieces; no_shard: the whole unit), adjacent runs of one
// kind merged, with each trainable run's offset in the compact arrays: its
// store offset less the frozen stretches before it.
static void unit_runs(fce *f, int u) {
    cu_unit *U = &f->u[u];
    int np = f->m.units[u].n_params;
    U->trains = fc_unit_trains(&f->m, u);
    U->fz = mallocCheck((size_t)(np ? np : 1) * sizeof *U->fz);
    U->n_fz = U->trains ? fc_unit_frozen_slots(f->lay, &f->m, u, &f->g, U->fz) : 0;
    U->runs = mallocCheck((size_t)(np + U->n_own + 1) * sizeof *U->runs);
    U->n_runs = 0;
    for (int q = 0; q < U->n_own; q++) {
        size_t base = U->own[q].unit_off, at = U->own[q].chunk_off, len = U->own[q].count;
        for (size_t i = 0, r; i < len; i += r) {
            int fz = 0;
            r = f->m.n_frozen ? fc_model_run_at(&f->m, u, base + i, len - i, &fz) : len;
            size_t before = 0;  // frozen elements of the store before this run
            for (int k = 0; k < U->n_fz && U->fz[k].chunk_off < at + i; k++) before += U->fz[k].count;
            cu_run *last = U->n_runs ? &U->runs[U->n_runs - 1] : NULL;
            // adjacent in the store: no frozen stretch between, so the state is adjacent too
            if (last && last->frozen == fz && last->off + last->count == at + i)
                last->count += r;
            else
                U->runs[U->n_runs++] = (cu_run){at + i, r, fz ? 0 : at + i - before, fz};
        }
    }
    size_t frozen = 0;
    for (int k = 0; k < U->n_fz; k++) frozen += U->fz[k].count;
    U->state_n = U->store - fc_unit_frozen_store(f->lay, &f->m, u, &f->g);
    if (U->state_n != (U->trains ? U->store - frozen : 0))
        fc_die(FC_EXIT_INTERNAL, "unit %d: %zu optimizer state elements, the frozen stretches leave %zu", u, U->state_n,
               U->trains ? U->store - frozen : 0);
    // FSDP2 keeps no gradient for a frozen parameter; FSDP1's FlatParameter a whole one
    U->grad_compact = !f->lay->wire_is_natural && U->n_fz > 0;
}

// Unit u's compact array [state_n] <-> its store order [store] (host):
// to_full expands (the frozen stretches read as zeros), else compacts (they
// are not written back).
static void state_copy(const cu_unit *U, float *full, float *compact, int to_full) {
    if (to_full) memset(full, 0, U->store * sizeof(float));
    if (!U->state_n) return;
    size_t at = 0, c = 0;  // store and compact positions
    for (int k = 0; k <= U->n_fz; k++) {  // the stretch before each frozen one, then the rest
        size_t end = k < U->n_fz ? U->fz[k].chunk_off : U->store;
        float *a = full + at, *b = compact + c;
        memcpy(to_full ? a : b, to_full ? b : a, (end - at) * sizeof(float));
        c += end - at;
        at = k < U->n_fz ? end + U->fz[k].count : end;
    }
}

fce *fce_create(const fc_run_config *cfg, fce_comms *c, fcx *x, fc_error *e) {
    fce *f = callocCheck(1, sizeof *f);
    f->cfg = *cfg;
    f->x = x;
    f->g = c->g;
    f->local = cfg->strategy == FC_STRATEGY_LOCAL;
    double pre, post;  // over the whole data-parallel world (as FSDP does for HSDP too)
    fc_divide_factors(cfg->divide, fc_divide_by(cfg, f->g.W), &pre, &post);
    f->pre = (float)pre;
    f->post = (float)post;
    fc_model_build_run(&f->m, cfg);
    const fc_model *m = &f->m;
    f->n_state = fc_optim_state_names(&cfg->optim, f->state_names);
    float *from_file = NULL;
    if (cfg->init_path[0]) {
        from_file = mallocCheck(m->numel * sizeof(float));
        if (fc_weights_load(m, cfg->init_path, from_file, e)) {
            free(from_file);
            fc_model_free(&f->m);
            free(f);
            return NULL;
        }
    }
    f->lay = fc_layout_of(fc_layout_kind_of(cfg));
    f->c = *c;  // the engine owns the communicators from here
    c->world = MPI_COMM_NULL;
    f->u = callocCheck((size_t)m->n_units, sizeof(cu_unit));
    f->st = callocCheck((size_t)m->n_units, sizeof(fc_unit_stages));
    f->prefetch_list = callocCheck((size_t)m->n_units, sizeof(int));
    fc_mem_loc loc = cfg->cpu_offload ? FC_LOC_HOST : FC_LOC_DEVICE;
    for (int u = 0; u < m->n_units; u++) {
        cu_unit *U = &f->u[u];
        fc_unit_layout l = fc_unit_layout_in(f->lay, m, u, &f->g);
        U->numel = l.numel;
        U->shard = l.shard;
        U->padded = l.padded;
        U->own_off = l.own_off;
        U->own_valid = l.own_valid;
        U->store = l.store;
        U->gathered_numel = f->lay->wire_is_natural ? U->padded : U->numel;
        U->own = mallocCheck((size_t)fc_layout_max_pieces(m, u) * sizeof *U->own);
        if (f->g.sharded) {
            U->n_own = f->lay->pieces(m, u, f->g.G, f->g.idx, U->own);
        } else {  // no_shard stores, steps and initialises the whole unit
            U->own[0] = (fc_piece){0, 0, U->numel};
            U->n_own = 1;
        }
        unit_runs(f, u);
        size_t bytes = U->store * sizeof(float), sbytes = U->state_n * sizeof(float);
        U->param = fcx_alloc(x, loc, FC_MEM_PARAM_SHARD, bytes, FCX_COMPUTE);
        // FSDP1 keeps no gradient for a FlatParameter that does not train
        size_t gbytes = U->grad_compact ? sbytes : bytes;
        if (U->trains) U->grad = fcx_alloc(x, loc, FC_MEM_GRAD_SHARD, gbytes, FCX_COMPUTE);
        for (int i = 0; i < f->n_state && sbytes; i++) {
            U->state[i] = fcx_alloc(x, loc, FC_MEM_OPTIM_STATE, sbytes, FCX_COMPUTE);
            fcx_zero(x, U->state[i], sbytes, FCX_COMPUTE);
        }
        f->st[u] = fc_unit_stages_of(m, u);
        U->reshard_after_forward = fc_reshard_after_forward(cfg->strategy, m, u);
        float *init = callocCheck(U->store ? U->store : 1, sizeof(float));  // padding stays 0
        init_unit(f, u, from_file, init);
        fcx_upload(x, U->param, init, bytes);
        free(init);
    }
    free(from_file);
    fcx_sync(x);  // the zeroed states are in place before anything reads them
    f->rs_unit = -1;
    int first, local;
    fc_rank_samples(cfg, f->g.W, f->g.rank, &first, &local);
    f->micro = local / cfg->grad_accum;
    int T = fc_model_has_tokens(&cfg->model) ? cfg->seq_len : 0;
    f->rows = f->micro * (T ? T : 1);
    fc_batch_alloc(&f->batch, &cfg->model, local, T);
    f->up = callocCheck((size_t)m->n_units, sizeof *f->up);
    f->ug = callocCheck((size_t)m->n_units, sizeof *f->ug);
    fc_log_init(&f->log);
    return f;
}

int fce_export(fce *f, fc_export what, float *dst, int root, fc_error *e) {
    int si = what == FC_EXPORT_STATE0 ? 0 : what == FC_EXPORT_STATE1 ? 1 : -1;
    if (si >= f->n_state) return fc_fail(e, "export: the optimizer keeps no state %d", si);
    if (root != 0) return fc_fail(e, "export: root must be rank 0");
    fcx_sync(f->x);
    for (int u = 0; u < f->m.n_units; u++) {
        cu_unit *U = &f->u[u];
        float *out = dst ? dst + f->m.units[u].offset : NULL;
        // this rank's store [store] on the host: a frozen element's state, and
        // the gradient of a unit that does not train, read as zeros
        float *mine = callocCheck(U->store ? U->store : 1, sizeof(float));
        if (what == FC_EXPORT_PARAMS) {
            fcx_download(f->x, mine, U->param, U->store * sizeof(float));
        } else if (what == FC_EXPORT_GRADS) {
            size_t gn = U->grad_compact ? U->state_n : U->store;
            float *g = U->grad_compact ? mallocCheck(gn * sizeof(float) + 1) : mine;
            if (U->grad) fcx_download(f->x, g, U->grad, gn * sizeof(float));
            if (g != mine) state_copy(U, mine, g, 1);
            if (g != mine) free(g);
        } else if (U->state[si] && U->state_n == U->store) {
            fcx_download(f->x, mine, U->state[si], U->store * sizeof(float));
        } else if (U->state[si]) {
            float *compact = mallocCheck(U->state_n * sizeof(float));
            fcx_download(f->x, compact, U->state[si], U->state_n * sizeof(float));
            state_copy(U, mine, compact, 1);
            free(compact);
        }
        if (!f->g.sharded) {
            if (f->g.rank == 0) memcpy(out, mine, U->numel * sizeof(float));
            free(mine);
            continue;
        }
        // shard-group rank 0 of every group gathers its group's shards; world
        // rank 0 is shard rank 0 of group 0, and replicas hold the same values
        float *full = f->g.shard_rank == 0 ? mallocCheck(U->padded * sizeof(float)) : NULL;  // [P] wire order
        mpiCheck(MPI_Gather(mine, (int)U->shard, MPI_FLOAT, full, (int)U->shard, MPI_FLOAT, 0, f->c.shard));
        if (f->g.rank == 0) fc_layout_to_natural(f->lay, &f->m, u, f->g.G, full, out);
        free(full);
        free(mine);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// checkpoints: host views of this rank's shards for the core protocol
// (core/ckpt_collective.h), which reads and writes every array in store
// order. Device shards are staged through host copies; offloaded ones are
// host memory already, except optimizer states kept compactly (a unit with
// frozen elements), which are staged in store order, zeros where frozen.

typedef struct {
    fc_ckpt_unit_view *units;
    float **stage;  // [n_units * 3]: host copies of param, state0, state1 (NULL where not staged)
} ckpt_views;

// t: 0 the parameters, 1 + i optimizer state i
static float *view_of(fce *f, ckpt_views *cv, int u, int t, int download) {
    const cu_unit *U = &f->u[u];
    if (t > f->n_state) return NULL;
    float *src = t == 0 ? U->param : U->state[t - 1];
    int compact = t > 0 && U->state_n != U->store;
    if (f->cfg.cpu_offload && !compact && src) return src;
    size_t bytes = U->store * sizeof(float);
    float *h = callocCheck(bytes ? bytes : 1, 1);
    if (download && !compact) {
        fcx_download(f->x, h, src, bytes);
    } else if (download && src) {
        float *c = mallocCheck(U->state_n * sizeof(float));
        fcx_download(f->x, c, src, U->state_n * sizeof(float));
        state_copy(U, h, c, 1);
        free(c);
    }
    cv->stage[u * 3 + t] = h;
    return h;
}

// A staged view back where it came from, after a load.
static void unstage(fce *f, ckpt_views *cv, int u, int t) {
    const cu_unit *U = &f->u[u];
    float *h = cv->stage[u * 3 + t];
    float *dst = t == 0 ? U->param : U->state[t - 1];
    if (!h || !dst) return;
    if (t == 0 || U->state_n == U->store) {
        fcx_upload(f->x, dst, h, U->store * sizeof(float));
        return;
    }
    float *c = mallocCheck(U->state_n * sizeof(float));
    state_copy(U, h, c, 0);
    fcx_upload(f->x, dst, c, U->state_n * sizeof(float));  // a memcpy into pinned host memory under offload
    free(c);
}

static void ckpt_view(fce *f, ckpt_views *cv, fc_ckpt_rank_view *v, int download) {
    int nu = f->m.n_units;
    cv->units = callocCheck((size_t)nu, sizeof *cv->units);
    cv->stage = callocCheck((size_t)nu * 3, sizeof *cv->stage);
    fcx_sync(f->x);
    for (int u = 0; u < nu; u++) {
        cu_unit *U = &f->u[u];
        cv->units[u] = (fc_ckpt_unit_view){U->numel,
                                           U->own_off,
                                           U->own_valid,
                                           U->store,
                                           !f->g.sharded,
                                           view_of(f, cv, u, 0, download),
                                           {view_of(f, cv, u, 1, download), view_of(f, cv, u, 2, download)},
                                           NULL,
                                           0,
                                           0};
        if (!f->lay->wire_is_natural) {  // FSDP2's rows: the chunk is pieces
            cv->units[u].pieces = U->own;
            cv->units[u].n_pieces = U->n_own;
            cv->units[u].max_pieces = fc_layout_max_pieces(&f->m, u);
        }
    }
    // the chunks of replica 0 of every shard group tile each unit once (for
    // no_shard, every rank's W-way chunk of its full copy)
    *v = (fc_ckpt_rank_view){f->c.world, &f->cfg, &f->m, f->cfg.strategy, f->step,
                             f->g.sharded ? f->g.replica == 0 : 1, cv->units, 0};
}

static void ckpt_views_free(fce *f, ckpt_views *cv) {
    for (int i = 0; i < f->m.n_units * 3; i++) free(cv->stage[i]);
    free(cv->stage);
    free(cv->units);
}

int fce_save(fce *f, const char *dir, fc_state_dict kind, fc_error *e) {
    ckpt_views cv;
    fc_ckpt_rank_view v;
    ckpt_view(f, &cv, &v, 1);
    int rc = fc_ckpt_save_collective(&v, dir, kind, e);
    ckpt_views_free(f, &cv);
    return rc;
}

int fce_load(fce *f, const char *dir, fc_error *e) {
    ckpt_views cv;
    fc_ckpt_rank_view v;
    ckpt_view(f, &cv, &v, 0);
    long step = 0;
    int rc = fc_ckpt_load_collective(&v, dir, NULL, NULL, &step, e);
    if (rc == 0) {
        for (int u = 0; u < f->m.n_units; u++)  // staged copies back to the device
            for (int t = 0; t < 3; t++) unstage(f, &cv, u, t);
        // the step count drives AdamW's bias correction, SGD's first momentum
        // step and the data position
        f->step = step;
    }
    ckpt_views_free(f, &cv);
    return rc;
}

long fce_steps(const fce *f) { return f->step; }
const fc_comm_log *fce_log(const fce *f) { return &f->log; }
void fce_memory(const fce *f, fc_mem_stats *out) { fcx_memory(f->x, out); }

void fce_destroy(fce *f) {
    if (!f) return;
    if (f->u) {
        for (int u = 0; u < f->m.n_units; u++) {
            cu_unit *U = &f->u[u];
            if (U->ag_pending) fcx_wait(f->x, &U->ag_req);
            if (U->ag_send) fcx_free(f->x, U->ag_send, FCX_COMM);
            if (U->ag_wire) fcx_free(f->x, U->ag_wire, FCX_COMM);
            if (U->pf_slice) fcx_free(f->x, U->pf_slice, FCX_COMPUTE);
            free(U->own);
            if (U->gathered_owned) fcx_free(f->x, U->gathered, FCX_COMPUTE);
            if (U->full_grad) fcx_free(f->x, U->full_grad, FCX_COMPUTE);
            fcx_free(f->x, U->param, FCX_COMPUTE);
            if (U->grad) fcx_free(f->x, U->grad, FCX_COMPUTE);
            free(U->runs);
            free(U->fz);
            for (int i = 0; i < 2; i++)
                if (U->state[i]) fcx_free(f->x, U->state[i], FCX_COMPUTE);
        }
    }
    if (f->rs_unit >= 0 && !f->local) fcx_wait(f->x, &f->rs_req);
    if (f->rs_send) fcx_free(f->x, f->rs_send, FCX_COMPUTE);
    if (f->rs_out) fcx_free(f->x, f->rs_out, FCX_COMPUTE);
    fcx_sync(f->x);
    free(f->u);
    free(f->st);
    free(f->prefetch_list);
    free(f->up);
    free(f->ug);
    fc_batch_free(&f->batch);
    fc_log_free(&f->log);
    fc_model_free(&f->m);
    fce_comms_free(&f->c);
    free(f);
}
