// optimized/exec_cuda.c — see exec_cuda.h and exec.h.
//
// Memory: every device allocation comes from one stream-ordered pool owned by
// this executor (cudaMallocFromPoolAsync / cudaFreeAsync on the stream the
// engine names) and is entered in the book under its category, so the
// figures the contract reports are the allocations really made; after every
// step they are checked against the pool's own count of bytes in use and,
// when no other rank shares the device, against cudaMemGetInfo (a warning:
// the device's count moves with the driver's own allocations too). cpu_offload
// shards are pinned, mapped host memory (cudaHostAlloc), which the kernels
// read and write in place (unified addressing). The executor's own buffers
// (activations, the cuBLASLt workspace, the batch) are tagged activations.
#include "exec_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acts.h"
#include "alloc_book.h"
#include "clip.h"
#include "comm.h"
#include "cuda_check.h"
#include "cuda_config.h"
#include "enc_buckets.h"
#include "kernels.h"
#include "layout.h"
#include "model_cu.h"
#include "optim.h"

// The largest amount a pool allocation may be rounded up by (the cross-check's
// slack per live allocation): the pool's 2 MiB allocation granularity.
#define POOL_GRANULARITY ((size_t)2 << 20)

struct fcx {
    fc_run_config cfg;
    fc_model m;
    fc_groups g;
    int dev, shared;
    cudaStream_t st[FCX_NSTREAMS];
    cudaMemPool_t pool;
    fc_book book;
    void *ws;            // [FC_CUDA_WORKSPACE] cuBLASLt workspace
    fck_mm *mm;
    fc_cu_acts L;
    void *acts;          // [2 * L.half]
    fc_cu_model *cm;
    fc_cucomm *shard, *replica, *post_fwd;
    size_t **pmap;       // [n_units] device: FSDP2's piece maps (fck_permute); NULL under FSDP1
    int *n_pmap;         // [n_units] pieces in each
    fc_norm_part *dnorm; // [FCK_NORM_BLOCKS + 1 + G] device: the blocks' partial norms, this rank's, the gather
    int K, micro, T, rows, in_dim;
    int32_t *d_input, *d_target;  // [local * T] (gpt2, llama), target [local] (mlp)
    float *d_features;            // [local * in] (mlp)
    int32_t *d_tok, *d_off, *d_pos;  // per micro-batch buckets: [K][rows], [K][rows + 1], [K][rows]
    int *n_tok;                       // [K]
    int32_t *h_count, *h_tok, *h_off, *h_pos;  // host scratch for the buckets
    float *h_losses;     // [K * rows] pinned: each micro-batch's row losses
    size_t used0;        // cudaMemGetInfo's used bytes at create, less the tagged ones then
};

static void book_check(int rc, const fc_error *e) {
    if (rc) fc_die(FC_EXIT_INTERNAL, "%s", e->msg);
}

// ---------------------------------------------------------------------------
// memory

void *fcx_alloc(fcx *x, fc_mem_loc loc, fc_mem_cat cat, size_t bytes, fcx_stream s) {
    void *p = NULL;
    size_t real = bytes ? bytes : 1;  // a zero-byte tensor still gets its own address
    if (loc == FC_LOC_HOST)
        cudaCheck(cudaHostAlloc(&p, real, cudaHostAllocMapped | cudaHostAllocPortable));
    else
        cudaCheck(cudaMallocFromPoolAsync(&p, real, x->pool, x->st[s]));
    fc_error e;
    book_check(fc_book_add(&x->book, p, bytes, loc, cat, &e), &e);
    return p;
}

void fcx_free(fcx *x, void *p, fcx_stream s) {
    if (!p) return;
    fc_book_entry ent;
    fc_error e;
    book_check(fc_book_remove(&x->book, p, &ent, &e), &e);
    if (ent.loc == FC_LOC_HOST)
        cudaCheck(cudaFreeHost(p));
    else
        cudaCheck(cudaFreeAsync(p, x->st[s]));
}

void fcx_memory(const fcx *x, fc_mem_stats *out) { *out = x->book.stats; }

int fcx_crosscheck(fcx *x, fc_error *e) {
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMM]));
    uint64_t used = 0;
    cudaCheck(cudaMemPoolGetAttribute(x->pool, cudaMemPoolAttrUsedMemCurrent, &used));
    size_t tagged = fc_book_bytes(&x->book, FC_LOC_DEVICE);
    if (fc_book_crosscheck(tagged, x->book.live[FC_LOC_DEVICE], used, POOL_GRANULARITY, e)) return -1;
    if (x->shared) return 0;  // another process's allocations would show in cudaMemGetInfo
    // the device's own count: memory the driver, cuBLAS or NCCL give back
    // after create also lowers it, so a shortfall is a warning, not a failure
    size_t free_b = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total));
    size_t now = total - free_b;
    static int warned;
    fc_error w;
    if (fc_book_crosscheck_device(tagged, now > x->used0 ? now - x->used0 : 0, &w) && !warned) {
        fprintf(stderr, "fsdpcheck: cuda: warning: %s\n", w.msg);
        warned = 1;
    }
    return 0;
}

static fc_mem_loc loc_of(fcx *x, const void *p, size_t bytes) {
    const fc_book_entry *ent = fc_book_find(&x->book, p, bytes);
    return ent ? ent->loc : FC_LOC_DEVICE;
}

void fcx_upload(fcx *x, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, x->st[FCX_COMPUTE]));
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));
}

void fcx_download(fcx *x, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, x->st[FCX_COMPUTE]));
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));
}

void fcx_sync(fcx *x) {
    for (int s = 0; s < FCX_NSTREAMS; s++) cudaCheck(cudaStreamSynchronize(x->st[s]));
}

void fcx_order(fcx *x, fcx_stream waiter, fcx_stream signaler) {
    cudaEvent_t ev;
    cudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaCheck(cudaEventRecord(ev, x->st[signaler]));
    cudaCheck(cudaStreamWaitEvent(x->st[waiter], ev, 0));
    cudaCheck(cudaEventDestroy(ev));  // released once the wait is done with it
}

// ---------------------------------------------------------------------------
// elementwise

void fcx_copy(fcx *x, void *dst, const void *src, size_t bytes, fcx_stream s) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, x->st[s]));
}

void fcx_permute(fcx *x, int u, void *natural, void *wire, int to_wire, fc_prec p, fcx_stream s) {
    if (!x->pmap || !x->pmap[u])
        fc_die(FC_EXIT_INTERNAL, "%s:%d: a permute of unit %d, which has no piece map (FSDP1)", __FILE__, __LINE__, u);
    const fc_layout_ops *lay = fc_layout_of(fc_layout_kind_of(&x->cfg));
    size_t P = lay->chunk_size(&x->m, u, x->g.G) * (size_t)x->g.G;
    fck_permute(natural, wire, x->pmap[u], x->n_pmap[u], P, to_wire, p, x->st[s]);
}

// FSDP2's piece maps, uploaded once: for each unit, every chunk's pieces as
// (unit offset, wire offset, count) (core/layout.h fc_layout_wire_pieces).
static void make_piece_maps(fcx *x) {
    const fc_layout_ops *lay = fc_layout_of(fc_layout_kind_of(&x->cfg));
    if (lay->wire_is_natural) return;
    int nu = x->m.n_units, G = x->g.G;
    x->pmap = callocCheck((size_t)nu, sizeof *x->pmap);
    x->n_pmap = callocCheck((size_t)nu, sizeof *x->n_pmap);
    for (int u = 0; u < nu; u++) {
        size_t most = (size_t)G * (size_t)fc_layout_max_pieces(&x->m, u);
        fc_piece *pc = mallocCheck(most * sizeof *pc);
        size_t *h = mallocCheck(most * 3 * sizeof *h);
        int n = fc_layout_wire_pieces(lay, &x->m, u, G, pc);
        for (int q = 0; q < n; q++) {
            h[3 * q] = pc[q].unit_off;
            h[3 * q + 1] = pc[q].chunk_off;
            h[3 * q + 2] = pc[q].count;
        }
        x->n_pmap[u] = n;
        x->pmap[u] = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, (size_t)n * 3 * sizeof *h, FCX_COMPUTE);
        fcx_upload(x, x->pmap[u], h, (size_t)n * 3 * sizeof *h);
        free(h);
        free(pc);
    }
}

void fcx_zero(fcx *x, void *p, size_t bytes, fcx_stream s) {
    if (!bytes) return;
    if (loc_of(x, p, bytes) == FC_LOC_HOST) {  // pinned host: zero it once the stream is done with it
        cudaCheck(cudaStreamSynchronize(x->st[s]));
        memset(p, 0, bytes);
        return;
    }
    cudaCheck(cudaMemsetAsync(p, 0, bytes, x->st[s]));
}

void fcx_cast(fcx *x, void *dst, fc_prec p, const float *src, size_t n, fcx_stream s) {
    fck_cast(dst, p, src, n, x->st[s]);
}

void fcx_predivide(fcx *x, void *dst, fc_prec rd, const void *g, fc_prec pd, size_t n, float pre, fcx_stream s) {
    fck_predivide(dst, rd, g, pd, n, pre, x->st[s]);
}

void fcx_accumulate(fcx *x, float *grad, const void *src, fc_prec rd, size_t n, float post, fcx_stream s) {
    fck_accumulate(grad, src, rd, n, post, x->st[s]);
}

// ---------------------------------------------------------------------------
// collectives

static fc_cucomm *group(fcx *x, fcx_group g) {
    fc_cucomm *c = g == FCX_GROUP_SHARD ? x->shard : g == FCX_GROUP_REPLICA ? x->replica : x->post_fwd;
    if (!c) fc_die(FC_EXIT_INTERNAL, "%s:%d: no communicator for group %d", __FILE__, __LINE__, (int)g);
    return c;
}

void fcx_all_gather(fcx *x, fcx_group g, const void *send, void *recv, size_t count, fc_prec p, fcx_req *r) {
    r->impl = fc_comm_all_gather(group(x, g), send, recv, count, p, x->st[FCX_COMM]);
}

void fcx_reduce_scatter(fcx *x, fcx_group g, const void *send, void *recv, size_t count, fc_prec p, fcx_req *r) {
    r->impl = fc_comm_reduce_scatter(group(x, g), send, recv, count, p, x->st[FCX_COMM]);
}

void fcx_all_reduce(fcx *x, fcx_group g, void *buf, size_t count, fc_prec p, fcx_req *r) {
    r->impl = fc_comm_all_reduce(group(x, g), buf, count, p, x->st[FCX_COMM]);
}

void fcx_wait(fcx *x, fcx_req *r) {
    if (!r->impl) return;
    fc_comm_wait(r->impl, x->st[FCX_COMPUTE]);
    r->impl = NULL;
}

void fcx_gather_norm_parts(fcx *x, const fc_norm_part *mine, fc_norm_part *all) {
    fc_comm_gather_bytes(x->shard, mine, all, sizeof *mine, x->dnorm + FCK_NORM_BLOCKS, x->st[FCX_COMM]);
}

// ---------------------------------------------------------------------------
// the model

void fcx_set_batch(fcx *x, const fc_batch *b) {
    cudaStream_t s = x->st[FCX_COMPUTE];
    cudaCheck(cudaStreamSynchronize(s));  // the previous step is done with the batch buffers
    if (x->m.cfg.kind == FC_MODEL_MLP) {
        cudaCheck(cudaMemcpyAsync(x->d_features, b->features, (size_t)b->B * x->in_dim * sizeof(float),
                                  cudaMemcpyHostToDevice, s));
        cudaCheck(cudaMemcpyAsync(x->d_target, b->target, (size_t)b->B * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    } else {
        size_t n = (size_t)b->B * x->T;
        cudaCheck(cudaMemcpyAsync(x->d_input, b->input, n * sizeof(int32_t), cudaMemcpyHostToDevice, s));
        cudaCheck(cudaMemcpyAsync(x->d_target, b->target, n * sizeof(int32_t), cudaMemcpyHostToDevice, s));
        // the embedding backward's token buckets of every micro-batch (enc_buckets.h)
        int R = x->rows;
        for (int k = 0; k < x->K; k++) {
            x->n_tok[k] = fc_enc_buckets(b->input + (size_t)k * R, R, x->m.cfg.vocab_size, x->h_count,
                                         x->h_tok + (size_t)k * R, x->h_off + (size_t)k * (R + 1),
                                         x->h_pos + (size_t)k * R);
        }
        cudaCheck(cudaMemcpyAsync(x->d_tok, x->h_tok, (size_t)x->K * R * sizeof(int32_t), cudaMemcpyHostToDevice, s));
        cudaCheck(cudaMemcpyAsync(x->d_off, x->h_off, (size_t)x->K * (R + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, s));
        cudaCheck(cudaMemcpyAsync(x->d_pos, x->h_pos, (size_t)x->K * R * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    }
    cudaCheck(cudaStreamSynchronize(s));  // the host buffers may change again
}

static fc_cu_batch micro_batch(const fcx *x, int k) {
    fc_cu_batch b;
    memset(&b, 0, sizeof b);
    size_t R = (size_t)x->rows;
    if (x->m.cfg.kind == FC_MODEL_MLP) {
        b.features = x->d_features + (size_t)k * x->micro * x->in_dim;
        b.target = x->d_target + (size_t)k * x->micro;
    } else {
        b.input = x->d_input + (size_t)k * R;
        b.target = x->d_target + (size_t)k * R;
        b.tok = x->d_tok + (size_t)k * R;
        b.off = x->d_off + (size_t)k * (R + 1);
        b.pos = x->d_pos + (size_t)k * R;
        b.n_tok = x->n_tok[k];
    }
    return b;
}

void fcx_forward(fcx *x, int s, int k, void *const *up, float loss_scale) {
    fc_cu_batch b = micro_batch(x, k);
    fc_cu_stage_forward(x->cm, s, up, &b, loss_scale, x->st[FCX_COMPUTE]);
    if (s == x->m.n_stages - 1)
        cudaCheck(cudaMemcpyAsync(x->h_losses + (size_t)k * x->rows, fc_cu_losses(x->cm), (size_t)x->rows * sizeof(float),
                                  cudaMemcpyDeviceToHost, x->st[FCX_COMPUTE]));
}

void fcx_backward(fcx *x, int s, int k, void *const *up, void *const *ug) {
    fc_cu_batch b = micro_batch(x, k);
    fc_cu_stage_backward(x->cm, s, up, ug, &b, x->st[FCX_COMPUTE]);
}

float fcx_loss_sum(fcx *x, int k) {
    double total = 0.0;  // in row order, as the reference adds its rows
    const float *l = x->h_losses + (size_t)k * x->rows;
    for (int i = 0; i < x->rows; i++) total += (double)l[i];
    return (float)total;
}

// ---------------------------------------------------------------------------
// clip_grad_norm and the optimizer

void fcx_norm_part(fcx *x, float *const *g, const size_t *n, int nu, fc_norm_type t, int host, fc_norm_part *out) {
    memset(out, 0, sizeof *out);
    if (host) {  // the offloaded gradient shards: core/clip.c over the host copies
        cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));
        for (int u = 0; u < nu; u++) fc_norm_part_add(out, g[u], n[u], t);
        return;
    }
    fc_norm_part blocks[FCK_NORM_BLOCKS];
    cudaCheck(cudaMemsetAsync(x->dnorm, 0, sizeof blocks, x->st[FCX_COMPUTE]));
    fck_norm_parts(x->dnorm, g, n, nu, t, x->st[FCX_COMPUTE]);
    cudaCheck(cudaMemcpyAsync(blocks, x->dnorm, sizeof blocks, cudaMemcpyDeviceToHost, x->st[FCX_COMPUTE]));
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));
    for (int i = 0; i < FCK_NORM_BLOCKS; i++) fc_norm_part_merge(out, &blocks[i]);
}

void fcx_optim(fcx *x, const fc_optim_config *c, long step, float coef, int clip, float *const *p, float *const *g,
               float *const *s0, float *const *s1, const size_t *n, int nu, int host) {
    if (!host) {
        fck_optimizer(c, step, coef, clip, p, g, s0, s1, n, nu, x->st[FCX_COMPUTE]);
        return;
    }
    // cpu_offload: the step on the host, over the pinned shards, as PyTorch
    // does; the clip coefficient applied to a copy of the gradient
    enum { CHUNK = 1024 };
    float buf[CHUNK];
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));
    for (int u = 0; u < nu; u++) {
        for (size_t i = 0; i < n[u]; i += CHUNK) {
            size_t m = n[u] - i < CHUNK ? n[u] - i : CHUNK;
            for (size_t k = 0; k < m; k++) buf[k] = clip ? g[u][i + k] * coef : g[u][i + k];
            fc_optim_update(c, step, p[u] + i, buf, s0[u] ? s0[u] + i : NULL, s1[u] ? s1[u] + i : NULL, m);
        }
    }
}

// ---------------------------------------------------------------------------
// create / destroy

fcx *fcx_cuda_create(const fc_run_config *cfg, const fce_comms *c, int dev, fc_comm_kind kind, int shared) {
    fcx *x = callocCheck(1, sizeof *x);
    x->cfg = *cfg;
    x->g = c->g;
    x->dev = dev;
    x->shared = shared;
    fc_model_build_run(&x->m, cfg);
    cudaCheck(cudaSetDevice(dev));
    for (int s = 0; s < FCX_NSTREAMS; s++) cudaCheck(cudaStreamCreateWithFlags(&x->st[s], cudaStreamNonBlocking));
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaCheck(cudaMemPoolCreate(&x->pool, &props));
    uint64_t keep = UINT64_MAX;  // keep freed memory in the pool: no trips to the driver between steps
    cudaCheck(cudaMemPoolSetAttribute(x->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    fc_book_init(&x->book);

    int first, local;
    fc_rank_samples(cfg, c->g.W, c->g.rank, &first, &local);
    x->K = cfg->grad_accum;
    x->micro = local / x->K;
    x->T = fc_model_has_tokens(&cfg->model) ? cfg->seq_len : 1;
    x->rows = x->micro * x->T;
    x->in_dim = cfg->model.kind == FC_MODEL_MLP ? cfg->model.dims[0] : 0;

    x->ws = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, FC_CUDA_WORKSPACE, FCX_COMPUTE);
    x->mm = fck_mm_create(x->ws, FC_CUDA_WORKSPACE);
    fc_cu_acts_layout(&x->L, &cfg->model, x->micro, x->T, cfg->param_dtype);
    x->acts = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, 2 * x->L.half, FCX_COMPUTE);
    x->cm = fc_cu_model_create(&x->m, &x->L, x->acts, cfg->param_dtype, x->mm, x->st[FCX_COMPUTE]);
    size_t dn = FCK_NORM_BLOCKS + 1 + (size_t)c->g.G;
    x->dnorm = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, dn * sizeof(fc_norm_part), FCX_COMPUTE);
    size_t R = (size_t)x->rows, K = (size_t)x->K;
    if (cfg->model.kind == FC_MODEL_MLP) {
        x->d_features = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, (size_t)local * x->in_dim * sizeof(float),
                                  FCX_COMPUTE);
        x->d_target = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, (size_t)local * sizeof(int32_t), FCX_COMPUTE);
    } else {
        size_t n = (size_t)local * x->T;
        x->d_input = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, n * sizeof(int32_t), FCX_COMPUTE);
        x->d_target = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, n * sizeof(int32_t), FCX_COMPUTE);
        x->d_tok = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, K * R * sizeof(int32_t), FCX_COMPUTE);
        x->d_off = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, K * (R + 1) * sizeof(int32_t), FCX_COMPUTE);
        x->d_pos = fcx_alloc(x, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, K * R * sizeof(int32_t), FCX_COMPUTE);
        x->h_count = mallocCheck((size_t)cfg->model.vocab_size * sizeof(int32_t));
        x->h_tok = mallocCheck(K * R * sizeof(int32_t));
        x->h_off = mallocCheck(K * (R + 1) * sizeof(int32_t));
        x->h_pos = mallocCheck(K * R * sizeof(int32_t));
    }
    x->n_tok = callocCheck(K, sizeof(int));
    x->h_losses = fcx_alloc(x, FC_LOC_HOST, FC_MEM_ACTIVATIONS, K * R * sizeof(float), FCX_COMPUTE);
    cudaCheck(cudaStreamSynchronize(x->st[FCX_COMPUTE]));

    x->shard = fc_comm_create(kind, c->shard, &x->book);
    if (c->g.hybrid && c->g.R > 1) x->replica = fc_comm_create(kind, c->replica, &x->book);
    if (c->post_fwd != MPI_COMM_NULL) x->post_fwd = fc_comm_create(kind, c->post_fwd, &x->book);
    make_piece_maps(x);
    // the device's own count from here on, less what is tagged already
    size_t free_b = 0, total = 0;
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemGetInfo(&free_b, &total));
    size_t tagged = fc_book_bytes(&x->book, FC_LOC_DEVICE);
    x->used0 = total - free_b > tagged ? total - free_b - tagged : 0;
    return x;
}

void fcx_cuda_destroy(fcx *x) {
    if (!x) return;
    fcx_sync(x);
    fc_comm_destroy(x->shard);
    fc_comm_destroy(x->replica);
    fc_comm_destroy(x->post_fwd);
    for (int u = 0; x->pmap && u < x->m.n_units; u++) fcx_free(x, x->pmap[u], FCX_COMPUTE);
    free(x->pmap);
    free(x->n_pmap);
    fc_cu_model_destroy(x->cm);
    fck_mm_destroy(x->mm);
    void *own[] = {x->ws, x->acts, x->dnorm, x->d_features, x->d_input, x->d_target, x->d_tok, x->d_off, x->d_pos,
                   x->h_losses};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) fcx_free(x, own[i], FCX_COMPUTE);
    fcx_sync(x);
    cudaCheck(cudaMemPoolDestroy(x->pool));
    for (int s = 0; s < FCX_NSTREAMS; s++) cudaCheck(cudaStreamDestroy(x->st[s]));
    fc_book_free(&x->book);
    fc_cu_acts_free(&x->L);
    free(x->n_tok);
    free(x->h_count);
    free(x->h_tok);
    free(x->h_off);
    free(x->h_pos);
    fc_model_free(&x->m);
    free(x);
}
