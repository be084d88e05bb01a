// reference/faults/faults.c — the fault catalogue (docs/contract.md §9): the reference
// engine compiled a second time (reference/faults/seams.h), each seam carrying
// one known bug class, active only when the run's config names it (--inject).
// Every bug is drawn from real FSDP/ZeRO/NCCL issues; each sits beside the
// property expected to catch it (core/faults.h holds the same table for the
// oracle). The plain build, the one the oracle trusts, has none of this.
#include "seams.h"

#include <stdlib.h>
#include <string.h>

#include "arith_seams.h"  // the engine's own allocator: a port's build may align its buffers
#include "fsdp_engine.h"
#include "layout.h"
#include "mpicheck.h"

static int is(const struct fc_fsdp *f, fc_fault k) { return f->cfg.inject == k; }

// ---------------------------------------------------------------------------
// no_divide (P1): gradients summed, not averaged.
// divide_twice (P1): the pre-divide applied again after the sum.

void fc_fault_divide(struct fc_fsdp *f) {
    if (is(f, FC_FAULT_NO_DIVIDE)) f->pre = f->post = 1.0f;
    if (is(f, FC_FAULT_DIVIDE_TWICE)) f->post *= f->pre;
    // fsdp2_avg_twice (P1): ReduceOp.AVG already divided by the world, and
    // the gradient is divided by it again (a divide factor set on top of AVG)
    if (is(f, FC_FAULT_FSDP2_AVG_TWICE) && f->cfg.divide == FC_DIVIDE_AVG) f->post *= (float)f->g.W;
}

// ---------------------------------------------------------------------------
// data_overlap (P1): a rank reads its neighbour's samples.

int fc_fault_data_rank(const struct fc_fsdp *f, int rank) {
    return is(f, FC_FAULT_DATA_OVERLAP) && rank > 0 ? rank - 1 : rank;
}

// ---------------------------------------------------------------------------
// shard_offset (P1): the last unit's chunk j is taken from rank j+1's position.
// stale_gather (P4): a prefetched unit is computed on the previous gather's
// contents (the compute did not wait for its all-gather).

typedef struct {
    float **stale;  // [n_units] the previous gather of each unit, [P]
    float **pre;    // [n_units] clip_hsdp_shard_norm: the shard group's reduced chunk, [S]
    long pre_step;  // the step pre holds (it is reset when a new step's first chunk arrives)
} fault_state;

void fc_fault_created(struct fc_fsdp *f) {
    // rope_half (P1): the model's rotary embedding turns the other way
    if (is(f, FC_FAULT_ROPE_HALF)) f->m.rope_sign = -1;
    // lora_alpha (P1): PEFT's scaling taken as lora_alpha, not lora_alpha / r
    if (is(f, FC_FAULT_LORA_ALPHA)) f->m.lora_scale = f->cfg.model.lora_alpha;
    if (!is(f, FC_FAULT_STALE_GATHER) && !is(f, FC_FAULT_CLIP_HSDP_SHARD_NORM)) return;
    fault_state *s = callocCheck(1, sizeof *s);
    s->stale = callocCheck((size_t)f->m.n_units, sizeof *s->stale);
    s->pre = callocCheck((size_t)f->m.n_units, sizeof *s->pre);
    s->pre_step = -1;
    f->seam_state = s;
}

void fc_fault_destroy(struct fc_fsdp *f) {
    fault_state *s = f->seam_state;
    if (!s) return;
    for (int u = 0; u < f->m.n_units; u++) free(s->stale[u]), free(s->pre[u]);
    free(s->stale);
    free(s->pre);
    free(s);
    f->seam_state = NULL;
}

void fc_fault_gathered(struct fc_fsdp *f, int u) {
    unit_state *U = &f->u[u];
    if (is(f, FC_FAULT_SHARD_OFFSET) && u == f->m.n_units - 1 && f->g.F > 1) {
        float *copy = mallocCheck(U->padded * sizeof(float));
        memcpy(copy, U->gathered, U->padded * sizeof(float));
        for (int j = 0; j < f->g.F; j++)
            memcpy(U->gathered + (size_t)j * U->shard, copy + (size_t)((j + 1) % f->g.F) * U->shard,
                   U->shard * sizeof(float));
        free(copy);
    }
    fault_state *s = f->seam_state;
    if (is(f, FC_FAULT_STALE_GATHER) && U->ag_prefetched) {
        if (!s->stale[u]) {
            s->stale[u] = mallocCheck(U->padded * sizeof(float));
            memcpy(s->stale[u], U->gathered, U->padded * sizeof(float));
        } else {
            float *fresh = U->gathered;
            U->gathered = s->stale[u];
            s->stale[u] = fresh;
        }
    }
}

// ---------------------------------------------------------------------------
// no_sync_overwrite (P6): accumulation overwrites instead of adding: the
// unsharded gradient of earlier micro-batches is dropped.

void fc_fault_backward_begin(struct fc_fsdp *f, int u) {
    unit_state *U = &f->u[u];
    if (is(f, FC_FAULT_NO_SYNC_OVERWRITE) && U->full_grad) memset(U->full_grad, 0, U->padded * sizeof(float));
}

// ---------------------------------------------------------------------------
// tied_untied (P1): the tied embedding gets only one of its two gradient
// paths: the embedding's contribution to wte is lost.

void fc_fault_stage_backward(struct fc_fsdp *f, int s, const fc_batch *mb, float scale) {
    const fc_model *m = &f->m;
    unit_state *U = &f->u[m->stages[s].unit];
    size_t wte_n = fc_model_tied(&m->cfg) ? m->params[0].numel : 0;  // wte / embed_tokens, the root's first
    float *wte_saved = NULL;
    if (is(f, FC_FAULT_TIED_UNTIED) && m->stages[s].kind == FC_STAGE_EMBED) {
        wte_saved = mallocCheck(wte_n * sizeof(float));
        memcpy(wte_saved, U->full_grad, wte_n * sizeof(float));
    }
    fc_stage_backward(m, s, f->up, mb, &f->acts, f->ug, scale);
    if (wte_saved) {
        memcpy(U->full_grad, wte_saved, wte_n * sizeof(float));
        free(wte_saved);
    }
}

// ---------------------------------------------------------------------------
// skip_root_reduce (P1): the root unit's gradient is divided as if reduced
// but never communicated, so each rank keeps its local gradient.

int fc_fault_skip_reduce(struct fc_fsdp *f, int u) {
    if (!is(f, FC_FAULT_SKIP_ROOT_REDUCE) || u != f->m.root_unit) return 0;
    unit_state *U = &f->u[u];
    size_t lo = f->g.sharded ? U->own_off : 0, n = f->g.sharded ? U->own_valid : U->numel;
    for (size_t i = 0; i < n; i++) U->grad[i] += U->full_grad[lo + i] / f->pre / f->post;
    size_t pb = fc_prec_size(f->cfg.param_dtype);
    fc_mem_sub(&f->mem, FC_LOC_DEVICE, FC_MEM_GATHERED_GRADS, U->padded * pb);
    free(U->full_grad);
    U->full_grad = NULL;
    return 1;
}

// ---------------------------------------------------------------------------
// fsdp2_padding_norm (P8): FSDP2's reduce-scatter input is allocated, not
// zeroed, so each parameter's padded rows carry what the buffer held; the
// reduced padding is kept beside the shard and clip_grad_norm counts the
// whole padded shard. Only the norm, and through it the clip coefficient,
// moves: the optimizer and the exported gradient take the real rows.

// 1 where chunk j's element i (0 <= i < S) is a real element of unit u
static unsigned char *real_mask(const struct fc_fsdp *f, int u, int j) {
    const unit_state *U = &f->u[u];
    unsigned char *real = callocCheck(U->shard ? U->shard : 1, 1);
    int mp = fc_layout_max_pieces(&f->m, u);
    const fc_piece *pc = U->pieces + (size_t)j * (size_t)mp;
    for (int k = 0; k < U->n_pieces[j]; k++) memset(real + pc[k].chunk_off, 1, pc[k].count);
    return real;
}

static void fsdp2_fill_padding(const struct fc_fsdp *f, int u, float *wire, float v) {
    const unit_state *U = &f->u[u];
    if (f->lay->wire_is_natural) return;
    for (int j = 0; j < f->g.G; j++) {
        unsigned char *real = real_mask(f, u, j);
        for (size_t i = 0; i < U->shard; i++)
            if (!real[i]) wire[(size_t)j * U->shard + i] = v;
        free(real);
    }
}

// ---------------------------------------------------------------------------
// padding_leak (P1): padding elements enter gradients and norms: the padding
// of the unsharded gradient is not zero, and a reduced chunk's padding is
// accumulated and normed.

void fc_fault_padding(const struct fc_fsdp *f, int u, float *wire, size_t numel, size_t padded) {
    if (is(f, FC_FAULT_PADDING_LEAK))
        for (size_t i = numel; i < padded; i++) wire[i] = 0.01f;
    if (is(f, FC_FAULT_FSDP2_PADDING_NORM)) fsdp2_fill_padding(f, u, wire, 0.01f);
}

size_t fc_fault_valid(const struct fc_fsdp *f, size_t own_valid, size_t S) {
    return is(f, FC_FAULT_PADDING_LEAK) ? S : own_valid;
}

// ---------------------------------------------------------------------------
// avg_tail (P1): an average leaves the last elements of a chunk unscaled.

void fc_fault_divided(const struct fc_fsdp *f, float *grad, const float *sum, size_t n, fc_prec rd) {
    if (is(f, FC_FAULT_FSDP2_PADDING_NORM) && f->g.sharded && !f->lay->wire_is_natural) {
        int u = f->rs_unit;  // the reduction being completed: sum is its reduced chunk [S]
        unsigned char *real = real_mask(f, u, f->g.idx);
        for (size_t i = 0; i < f->u[u].shard; i++)
            if (!real[i]) grad[i] += fc_round(rd, sum[i] / f->post);
        free(real);
    }
    if (!is(f, FC_FAULT_AVG_TAIL)) return;
    for (size_t i = n > 3 ? n - 3 : 0; i < n; i++) grad[i] += sum[i] - fc_round(rd, sum[i] / f->post);
}

// ---------------------------------------------------------------------------
// hsdp_no_replicate (P3): hybrid sharding skips the all-reduce across replicas.

int fc_fault_replicate(const struct fc_fsdp *f) { return !is(f, FC_FAULT_HSDP_NO_REPLICATE); }

// ---------------------------------------------------------------------------
// clip_local_norm (P8): clipping uses the local shard's norm.
// clip_double_count (P8): unsharded gradients counted W times in the norm
// (every replica's copy added again). padding_leak normed: see above.

void fc_fault_norm_piece(const struct fc_fsdp *f, int u, const float **g, size_t *n) {
    const unit_state *U = &f->u[u];
    const fault_state *s = f->seam_state;
    if (is(f, FC_FAULT_PADDING_LEAK) && f->g.sharded) *n = U->shard;
    if (is(f, FC_FAULT_FSDP2_PADDING_NORM) && f->g.sharded) {  // the whole padded shard, once
        *n = *g == U->grad + U->own[0].chunk_off ? U->shard : 0;
        *g = U->grad;
    }
    if (is(f, FC_FAULT_CLIP_DOUBLE_COUNT) && !f->g.sharded) *g = U->grad, *n = U->numel;
    if (is(f, FC_FAULT_CLIP_HSDP_SHARD_NORM) && s->pre[u] && s->pre_step == f->step) *g = s->pre[u];
}

void fc_fault_norm_group(const struct fc_fsdp *f, MPI_Comm *comm, int *G) {
    if (is(f, FC_FAULT_CLIP_DOUBLE_COUNT)) *comm = f->world, *G = f->g.W;
}

void fc_fault_norm_parts(const struct fc_fsdp *f, fc_norm_part *parts, int *G, const fc_norm_part *part) {
    if (is(f, FC_FAULT_CLIP_LOCAL_NORM)) *G = 1, parts[0] = *part;
}

// clip_eps_per_rank (P8; pytorch#149768): clip_grad_norm_'s eps (1e-6), meant
// once, is added by each of the G ranks of the norm group (a scalar added to a
// partial DTensor lands on every rank's local value), so the norm it returns
// and clips by is G - 1 eps too large. Nothing else moves: the gradients are
// right, only the norm and, through it, the clip coefficient.
void fc_fault_norm_total(const struct fc_fsdp *f, double *total, int G) {
    if (is(f, FC_FAULT_CLIP_EPS_PER_RANK)) *total += (G - 1) * 1e-6;
}

// clip_hsdp_shard_norm (P8): under hybrid sharding, the norm is taken over the
// shard group's own gradient, the reduced chunk before the replicas'
// all-reduce (the norm hooked in too early: each replica sees its own share of
// the batch), so replicas clip by different norms, all of them wrong.
void fc_fault_pre_replicate(struct fc_fsdp *f, int u, const float *acc, size_t n) {
    fault_state *s = f->seam_state;
    if (!is(f, FC_FAULT_CLIP_HSDP_SHARD_NORM)) return;
    if (s->pre_step != f->step) {  // the step's first chunk: the gradient restarts from 0
        for (int v = 0; v < f->m.n_units; v++)
            if (s->pre[v]) memset(s->pre[v], 0, f->u[v].shard * sizeof(float));
        s->pre_step = f->step;
    }
    if (!s->pre[u]) s->pre[u] = callocCheck(f->u[u].shard, sizeof(float));
    for (size_t i = 0; i < n; i++) s->pre[u][i] += acc[i] / f->post;
}

// ---------------------------------------------------------------------------
// bf16_truncate (P9): bf16 rounding by truncation instead of nearest-even.

uint16_t fc_fault_to_bf16(const struct fc_fsdp *f, float x) {
    if (!is(f, FC_FAULT_BF16_TRUNCATE)) return fc_f32_to_bf16(x);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);  // drop the low bits: round toward zero
}

// ---------------------------------------------------------------------------
// reduce_dtype_ignored (P9): gradients reduced in param_dtype when
// reduce_dtype asks for fp32.

fc_prec fc_fault_reduce_dtype(const struct fc_fsdp *f, fc_prec rd) {
    return is(f, FC_FAULT_REDUCE_DTYPE_IGNORED) ? f->cfg.param_dtype : rd;
}

// ---------------------------------------------------------------------------
// ckpt_swap (P7): two same-shaped tensors trade places in the state dict on
// load: the first two parameters of equal shape (gpt2's ln_1/ln_2 weights),
// every tensor of them; a model without such a pair (mlp) swaps parameter 0's
// value with its first optimizer state.

static void swap_source(void *ctx, int p, int t, int *sp, int *st) {
    const struct fc_fsdp *f = ctx;
    const fc_model *m = &f->m;
    for (int a = 0; a < m->n_params; a++)
        for (int b = a + 1; b < m->n_params; b++) {
            const fc_param *x = &m->params[a], *y = &m->params[b];
            if (x->ndim == y->ndim && x->shape[0] == y->shape[0] && x->shape[1] == y->shape[1]) {
                if (p == a || p == b) *sp = p == a ? b : a;
                return;
            }
        }
    if (f->n_state > 0 && p == 0 && t <= 1) *st = 1 - t;
}

fc_ckpt_source_fn fc_fault_ckpt_source(const struct fc_fsdp *f) {
    return is(f, FC_FAULT_CKPT_SWAP) ? swap_source : NULL;
}

// ckpt_drop_optim (P7): the optimizer state is not restored on load: it
// stays as created, zeros.
// adam_step_reset (P7): the optimizer step count restarts at 0 after a load
// (AdamW's bias correction starts over).

long fc_fault_loaded(struct fc_fsdp *f, long step) {
    if (is(f, FC_FAULT_CKPT_DROP_OPTIM))
        for (int u = 0; u < f->m.n_units; u++)
            for (int i = 0; i < f->n_state; i++) memset(f->u[u].state[i], 0, f->u[u].store * sizeof(float));
    return is(f, FC_FAULT_ADAM_STEP_RESET) ? 0 : step;
}

// frozen_in_norm (P8): the frozen parameters' gradients, which FSDP1 computes
// and reduces for a FlatParameter that also holds trainable ones, are dropped
// only after clip_grad_norm has counted them (the norm taken over the
// FlatParameter's gradient instead of the original parameters'). frozen_stepped
// (P1): they are never dropped, and the optimizer steps them (the views'
// requires_grad=False ignored: a frozen parameter trains on its own gradient).
int fc_fault_keep_frozen_grads(const struct fc_fsdp *f, fc_phase phase) {
    return (is(f, FC_FAULT_FROZEN_IN_NORM) && phase == FC_PHASE_CLIP) || is(f, FC_FAULT_FROZEN_STEPPED);
}

// frozen_decay (P1): AdamW's decoupled weight decay, p *= 1 - lr*wd, applied
// to every parameter of the group, frozen ones included (decay applied over
// the FlatParameter's shard, or a parameter group built from all parameters).
int fc_fault_step_frozen(const struct fc_fsdp *f, float *p, size_t n) {
    if (is(f, FC_FAULT_FROZEN_DECAY)) {
        float decay = (float)(1.0 - f->cfg.optim.lr * f->cfg.optim.weight_decay);
        for (size_t i = 0; i < n; i++) p[i] *= decay;
    }
    return is(f, FC_FAULT_FROZEN_STEPPED);
}

// dcp_saved_offsets (P7): a DCP checkpoint records every block that does not
// start at row 0 one row early in its saved_offsets (an off-by-one in the
// offset of a rank's rows). torch's reader trusts the offsets and loads the
// rows shifted; ours refuses the overlap, so the round trip fails.

int fc_fault_saved_offsets(const struct fc_fsdp *f) { return is(f, FC_FAULT_DCP_SAVED_OFFSETS) ? 1 : 0; }

// ---------------------------------------------------------------------------
// recompute_dtype (P15): activation checkpointing's recompute runs with the
// fp32 master weights, as when the autocast or parameter cast of the forward
// is not restored for the recompute (torch.utils.checkpoint must restore the
// autocast state for the recomputed activations to be the forward's). The
// forward computed with param_dtype weights, so the recomputed activations,
// and the gradients built on them, differ from a run without checkpointing.

const float *fc_fault_recompute_params(struct fc_fsdp *f, int u) {
    unit_state *U = &f->u[u];
    if (!is(f, FC_FAULT_RECOMPUTE_DTYPE) || f->cfg.param_dtype == FC_PREC_FP32) return U->gathered;
    if (!f->g.sharded) return U->param;  // no_shard holds all of its fp32 weights
    float *wire = mallocCheck(U->padded * sizeof(float));  // [P] the fp32 shards, rank-major
    fc_mpi_allgather(U->param, (int)U->shard, MPI_FLOAT, wire, f->shard);
    float *full = arith_calloc(U->gathered_numel * sizeof(float));  // [N] in the unit's order (flat: [P])
    fc_layout_to_natural(f->lay, &f->m, u, f->g.G, wire, full);
    free(wire);
    return full;
}

void fc_fault_recompute_done(struct fc_fsdp *f, int u, const float *p) {
    if (p != f->u[u].gathered && p != f->u[u].param) free((void *)p);
}

// ---------------------------------------------------------------------------
// fsdp2_even_rows (P10): FSDP2's rows split evenly, floor(rows / G) per rank
// and the remainder on the last, instead of torch.chunk's ceil(rows / G) with
// short and empty trailing ranks. Every rank agrees on the split, so the
// training is the same arithmetic on other rows: only what each rank holds
// and steps (the optimizer's elements in the comm log) shows it, and a
// checkpoint exchanged with real FSDP2 would land on the wrong rows.

static const fc_param *even_param(const fc_model *m, int u, int k, int G, size_t *rows, size_t *cols, size_t *q,
                                  size_t *c) {
    const fc_param *p = &m->params[m->unit_params[m->units[u].first_param + k]];
    *rows = (size_t)p->shape[0];
    *cols = p->numel / *rows;
    *q = *rows / (size_t)G;
    *c = *rows - (size_t)(G - 1) * *q;  // the last rank's, the most
    return p;
}

static size_t even_chunk_size(const fc_model *m, int u, int G) {
    size_t S = 0, rows, cols, q, c;
    for (int k = 0; k < m->units[u].n_params; k++) {
        even_param(m, u, k, G, &rows, &cols, &q, &c);
        S += c * cols;
    }
    return S;
}

static int even_pieces(const fc_model *m, int u, int G, int j, fc_piece *out) {
    int n = 0;
    size_t at = 0, rows, cols, q, c;
    for (int k = 0; k < m->units[u].n_params; k++) {
        const fc_param *p = even_param(m, u, k, G, &rows, &cols, &q, &c);
        size_t r0 = (size_t)j * q, r1 = j == G - 1 ? rows : r0 + q;
        if (r0 < r1) out[n++] = (fc_piece){p->unit_offset + r0 * cols, at, (r1 - r0) * cols};
        at += c * cols;
    }
    return n;
}

static int even_owner(const fc_model *m, int u, int G, size_t i) {
    size_t rows, cols, q, c;
    for (int k = 0; k < m->units[u].n_params; k++) {
        const fc_param *p = even_param(m, u, k, G, &rows, &cols, &q, &c);
        if (i < p->unit_offset || i >= p->unit_offset + p->numel) continue;
        size_t r = (i - p->unit_offset) / cols;
        return q == 0 || r / q >= (size_t)G ? G - 1 : (int)(r / q);
    }
    return -1;
}

static int even_slots(const fc_model *m, int u, int G, int j, fc_piece *out) {
    (void)j;
    size_t at = 0, rows, cols, q, c;
    int k = 0;
    for (; k < m->units[u].n_params; k++) {
        const fc_param *p = even_param(m, u, k, G, &rows, &cols, &q, &c);
        out[k] = (fc_piece){p->unit_offset, at, c * cols};
        at += c * cols;
    }
    return k;
}

static const fc_layout_ops EVEN_ROWS = {"per_param_even", 0, even_chunk_size, even_pieces, even_owner, even_slots};

const fc_layout_ops *fc_fault_layout(const struct fc_fsdp *f, const fc_layout_ops *lay) {
    return is(f, FC_FAULT_FSDP2_EVEN_ROWS) && !lay->wire_is_natural ? &EVEN_ROWS : lay;
}

// ---------------------------------------------------------------------------
// fsdp2_post_forward_group (P1): an integer reshard_after_forward R whose
// backward all-gather runs over strided ranks (rank % (W/R), a column of
// torch's mesh.view(-1, R)) instead of the row of R consecutive ranks, while
// each rank keeps its row's slice (rank % R): the gathered unit repeats some
// slices and misses others, and backward computes with wrong parameters.

int fc_fault_post_forward_group(const struct fc_fsdp *f, int row) {
    if (!is(f, FC_FAULT_FSDP2_POST_FORWARD_GROUP)) return row;
    return f->g.rank % (f->g.W / f->g.PF);
}
