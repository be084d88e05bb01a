// optimized/tests/exec_host.c — see exec_host.h.
#include "exec_host.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_book.h"
#include "clip.h"
#include "dtype.h"
#include "forward.h"
#include "layout.h"
#include "mpicheck.h"
#include "optim.h"
#include "staged.h"

typedef struct {
    void *result;  // the collective's result, delivered at fcx_wait
    void *dst;
    size_t bytes;
} host_req;

struct fcx {
    fc_run_config cfg;
    fc_model m;
    fc_groups g;
    MPI_Comm shard, replica, post_fwd;
    const fc_layout_ops *lay;
    fc_book book;
    const fc_batch *batch;  // this rank's samples of the step
    int micro, K;
    float *act_mem;
    fc_acts acts;
    float loss_scale;
    float *loss_sum;        // [K]
    int violations;
    char first[400];
};

static void violation(fcx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(fcx *x, const char *fmt, ...) {
    if (x->violations++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->first, sizeof x->first, fmt, ap);
        va_end(ap);
    }
}

// [p, p + bytes) must lie in a live allocation
static void need(fcx *x, const void *p, size_t bytes, const char *what) {
    if (!bytes) return;
    if (!p || !fc_book_find(&x->book, p, bytes)) violation(x, "%s: %zu bytes at %p are not inside a live allocation", what, bytes, p);
}

void *fcx_alloc(fcx *x, fc_mem_loc loc, fc_mem_cat cat, size_t bytes, fcx_stream s) {
    (void)s;
    void *p = callocCheck(bytes ? bytes : 1, 1);
    fc_error e;
    if (fc_book_add(&x->book, p, bytes, loc, cat, &e)) violation(x, "%s", e.msg);
    return p;
}

void fcx_free(fcx *x, void *p, fcx_stream s) {
    (void)s;
    if (!p) return;
    fc_error e;
    if (fc_book_remove(&x->book, p, NULL, &e)) {
        violation(x, "%s", e.msg);
        return;
    }
    free(p);
}

void fcx_memory(const fcx *x, fc_mem_stats *out) { *out = x->book.stats; }
int fcx_crosscheck(fcx *x, fc_error *e) {
    (void)x;
    (void)e;
    return 0;
}

void fcx_upload(fcx *x, void *dst, const void *src, size_t bytes) {
    need(x, dst, bytes, "upload");
    memcpy(dst, src, bytes);
}
void fcx_download(fcx *x, void *dst, const void *src, size_t bytes) {
    need(x, src, bytes, "download");
    memcpy(dst, src, bytes);
}
void fcx_sync(fcx *x) { (void)x; }
void fcx_order(fcx *x, fcx_stream waiter, fcx_stream signaler) {
    (void)x;
    (void)waiter;
    (void)signaler;
}

void fcx_zero(fcx *x, void *p, size_t bytes, fcx_stream s) {
    (void)s;
    need(x, p, bytes, "zero");
    memset(p, 0, bytes);
}

void fcx_copy(fcx *x, void *dst, const void *src, size_t bytes, fcx_stream s) {
    (void)s;
    need(x, dst, bytes, "copy dst");
    need(x, src, bytes, "copy src");
    memmove(dst, src, bytes);
}

void fcx_permute(fcx *x, int u, void *natural, void *wire, int to_wire, fc_prec p, fcx_stream s) {
    (void)s;
    size_t N = x->m.units[u].numel, P = x->lay->chunk_size(&x->m, u, x->g.G) * (size_t)x->g.G;
    need(x, natural, N * fc_prec_size(p), "permute natural");
    need(x, wire, P * fc_prec_size(p), "permute wire");
    float *a = mallocCheck(N * sizeof(float) + 1), *b = mallocCheck(P * sizeof(float) + 1);
    if (to_wire) {
        for (size_t i = 0; i < N; i++) a[i] = fc_prec_load(p, natural, i);
        fc_layout_to_wire(x->lay, &x->m, u, x->g.G, a, b);
        for (size_t i = 0; i < P; i++) fc_prec_store(p, wire, i, b[i]);
    } else {
        for (size_t i = 0; i < P; i++) b[i] = fc_prec_load(p, wire, i);
        fc_layout_to_natural(x->lay, &x->m, u, x->g.G, b, a);
        for (size_t i = 0; i < N; i++) fc_prec_store(p, natural, i, a[i]);
    }
    free(a);
    free(b);
}

void fcx_cast(fcx *x, void *dst, fc_prec p, const float *src, size_t n, fcx_stream s) {
    (void)s;
    need(x, dst, n * fc_prec_size(p), "cast dst");
    need(x, src, n * 4, "cast src");
    for (size_t i = 0; i < n; i++) fc_prec_store(p, dst, i, src[i]);
}

void fcx_predivide(fcx *x, void *dst, fc_prec rd, const void *g, fc_prec pd, size_t n, float pre, fcx_stream s) {
    (void)s;
    need(x, dst, n * fc_prec_size(rd), "predivide dst");
    need(x, g, n * fc_prec_size(pd), "predivide src");
    for (size_t i = 0; i < n; i++) fc_prec_store(rd, dst, i, fc_round(rd, fc_prec_load(pd, g, i)) / pre);
}

void fcx_accumulate(fcx *x, float *grad, const void *src, fc_prec rd, size_t n, float post, fcx_stream s) {
    (void)s;
    need(x, grad, n * 4, "accumulate dst");
    need(x, src, n * fc_prec_size(rd), "accumulate src");
    for (size_t i = 0; i < n; i++) grad[i] += fc_round(rd, fc_prec_load(rd, src, i) / post);
}

// ---------------------------------------------------------------------------
// collectives: MPI now, delivered at the wait

static MPI_Comm comm_of(fcx *x, fcx_group g) {
    MPI_Comm c = g == FCX_GROUP_SHARD ? x->shard : g == FCX_GROUP_REPLICA ? x->replica : x->post_fwd;
    if (c == MPI_COMM_NULL) fc_die(FC_EXIT_INTERNAL, "exec_host: a collective over group %d, which this run has not", g);
    return c;
}

static void defer(fcx_req *r, void *result, void *dst, size_t bytes) {
    host_req *h = mallocCheck(sizeof *h);
    h->result = result;
    h->dst = dst;
    h->bytes = bytes;
    r->impl = h;
}

void fcx_all_gather(fcx *x, fcx_group g, const void *send, void *recv, size_t count, fc_prec p, fcx_req *r) {
    MPI_Comm c = comm_of(x, g);
    int G;
    mpiCheck(MPI_Comm_size(c, &G));
    size_t es = fc_prec_size(p);
    need(x, send, count * es, "all_gather send");
    need(x, recv, count * G * es, "all_gather recv");
    void *out = mallocCheck(count * G * es + 1);
    mpiCheck(MPI_Allgather(send, (int)count, fc_prec_mpi_type(p), out, (int)count, fc_prec_mpi_type(p), c));
    defer(r, out, recv, count * G * es);
}

void fcx_reduce_scatter(fcx *x, fcx_group g, const void *send, void *recv, size_t count, fc_prec p, fcx_req *r) {
    MPI_Comm c = comm_of(x, g);
    int G;
    mpiCheck(MPI_Comm_size(c, &G));
    size_t es = fc_prec_size(p);
    need(x, send, count * G * es, "reduce_scatter send");
    need(x, recv, count * es, "reduce_scatter recv");
    void *ex = mallocCheck(count * G * es + 1), *out = mallocCheck(count * es + 1);
    mpiCheck(MPI_Alltoall(send, (int)count, fc_prec_mpi_type(p), ex, (int)count, fc_prec_mpi_type(p), c));
    fc_staged_sum(p, ex, G, count, out);
    free(ex);
    defer(r, out, recv, count * es);
}

void fcx_all_reduce(fcx *x, fcx_group g, void *buf, size_t count, fc_prec p, fcx_req *r) {
    MPI_Comm c = comm_of(x, g);
    int G;
    mpiCheck(MPI_Comm_size(c, &G));
    size_t es = fc_prec_size(p), S = fc_chunk_size(count, G), P = S * (size_t)G;
    need(x, buf, count * es, "all_reduce buf");
    void *pad = callocCheck(P * es + 1, 1), *ex = mallocCheck(P * es + 1), *acc = mallocCheck(S * es + 1);
    memcpy(pad, buf, count * es);
    mpiCheck(MPI_Alltoall(pad, (int)S, fc_prec_mpi_type(p), ex, (int)S, fc_prec_mpi_type(p), c));
    fc_staged_sum(p, ex, G, S, acc);
    mpiCheck(MPI_Allgather(acc, (int)S, fc_prec_mpi_type(p), pad, (int)S, fc_prec_mpi_type(p), c));
    free(ex);
    free(acc);
    defer(r, pad, buf, count * es);
}

void fcx_wait(fcx *x, fcx_req *r) {
    host_req *h = r->impl;
    if (!h) return;
    need(x, h->dst, h->bytes, "wait: the collective's destination");
    if (fc_book_find(&x->book, h->dst, h->bytes)) memcpy(h->dst, h->result, h->bytes);
    free(h->result);
    free(h);
    r->impl = NULL;
}

void fcx_gather_norm_parts(fcx *x, const fc_norm_part *mine, fc_norm_part *all) {
    mpiCheck(MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, x->shard));
}

// ---------------------------------------------------------------------------
// the model: the reference's stages on fp32 copies of the param_dtype buffers

void fcx_set_batch(fcx *x, const fc_batch *b) { x->batch = b; }

// fp32 view of unit u's param_dtype buffer (a copy unless fp32)
static float *widen(fcx *x, int u, const void *buf, const char *what) {
    size_t n = x->m.units[u].numel;
    fc_prec p = x->cfg.param_dtype;
    need(x, buf, n * fc_prec_size(p), what);
    if (p == FC_PREC_FP32) return (float *)buf;
    float *w = mallocCheck(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) w[i] = fc_prec_load(p, buf, i);
    return w;
}

void fcx_forward(fcx *x, int s, int k, void *const *up, float loss_scale) {
    int u = x->m.stages[s].unit;
    const float **tab = callocCheck((size_t)x->m.n_units, sizeof *tab);
    tab[u] = widen(x, u, up[u], "forward parameters");
    fc_batch mb = fc_batch_slice(x->batch, k * x->micro, x->micro);
    fc_stage_forward(&x->m, s, tab, &mb, &x->acts);
    if (s == x->m.n_stages - 1) x->loss_sum[k] = x->acts.loss_sum;
    x->loss_scale = loss_scale;
    if (tab[u] != up[u]) free((void *)tab[u]);
    free(tab);
}

void fcx_backward(fcx *x, int s, int k, void *const *up, void *const *ug) {
    int u = x->m.stages[s].unit;
    const float **tab = callocCheck((size_t)x->m.n_units, sizeof *tab);
    float **gtab = callocCheck((size_t)x->m.n_units, sizeof *gtab);
    tab[u] = widen(x, u, up[u], "backward parameters");
    // a unit that does not train gets no gradient buffer (exec.h): the
    // reference's stage computes its parameter gradients into scratch, dropped
    int scratch = ug[u] == NULL;
    if (scratch && fc_unit_trains(&x->m, u)) violation(x, "backward: no gradient buffer for unit %d, which trains", u);
    gtab[u] = scratch ? callocCheck(x->m.units[u].numel + 1, sizeof(float)) : widen(x, u, ug[u], "backward gradients");
    fc_batch mb = fc_batch_slice(x->batch, k * x->micro, x->micro);
    fc_stage_backward(&x->m, s, tab, &mb, &x->acts, gtab, x->loss_scale);
    if (scratch) {
        free(gtab[u]);
    } else if (gtab[u] != ug[u]) {  // back into param_dtype
        for (size_t i = 0; i < x->m.units[u].numel; i++) fc_prec_store(x->cfg.param_dtype, ug[u], i, gtab[u][i]);
        free(gtab[u]);
    }
    if (tab[u] != up[u]) free((void *)tab[u]);
    free(tab);
    free(gtab);
}

float fcx_loss_sum(fcx *x, int k) { return x->loss_sum[k]; }

void fcx_norm_part(fcx *x, float *const *g, const size_t *n, int nu, fc_norm_type t, int host, fc_norm_part *out) {
    (void)host;
    memset(out, 0, sizeof *out);
    for (int u = 0; u < nu; u++) {
        need(x, g[u], n[u] * 4, "norm");
        fc_norm_part_add(out, g[u], n[u], t);
    }
}

void fcx_optim(fcx *x, const fc_optim_config *c, long step, float coef, int clip, float *const *p, float *const *g,
               float *const *s0, float *const *s1, const size_t *n, int nu, int host) {
    (void)host;
    enum { CHUNK = 1024 };
    float buf[CHUNK];
    for (int u = 0; u < nu; u++) {
        need(x, p[u], n[u] * 4, "optim param");
        need(x, g[u], n[u] * 4, "optim grad");
        if (s0[u]) need(x, s0[u], n[u] * 4, "optim state0");
        if (s1[u]) need(x, s1[u], n[u] * 4, "optim state1");
        for (size_t i = 0; i < n[u]; i += CHUNK) {
            size_t m = n[u] - i < CHUNK ? n[u] - i : CHUNK;
            for (size_t k = 0; k < m; k++) buf[k] = clip ? g[u][i + k] * coef : g[u][i + k];
            fc_optim_update(c, step, p[u] + i, buf, s0[u] ? s0[u] + i : NULL, s1[u] ? s1[u] + i : NULL, m);
        }
    }
}

// ---------------------------------------------------------------------------

fcx *fcx_host_create(const fc_run_config *cfg, const fce_comms *c) {
    fcx *x = callocCheck(1, sizeof *x);
    x->cfg = *cfg;
    x->g = c->g;
    mpiCheck(MPI_Comm_dup(c->shard, &x->shard));
    mpiCheck(MPI_Comm_dup(c->replica, &x->replica));
    x->post_fwd = MPI_COMM_NULL;
    if (c->post_fwd != MPI_COMM_NULL) mpiCheck(MPI_Comm_dup(c->post_fwd, &x->post_fwd));
    x->lay = fc_layout_of(fc_layout_kind_of(cfg));
    fc_model_build_run(&x->m, cfg);
    fc_book_init(&x->book);
    int first, local;
    fc_rank_samples(cfg, c->g.W, c->g.rank, &first, &local);
    x->K = cfg->grad_accum;
    x->micro = local / x->K;
    int T = fc_model_has_tokens(&cfg->model) ? cfg->seq_len : 0;
    size_t an = fc_acts_numel(&x->m, x->micro, T);
    x->act_mem = mallocCheck(an * sizeof(float));
    fc_acts_init(&x->acts, &x->m, x->micro, T, x->act_mem);
    x->loss_sum = callocCheck((size_t)x->K, sizeof(float));
    return x;
}

void fcx_host_destroy(fcx *x) {
    if (!x) return;
    fc_book_free(&x->book);
    free(x->act_mem);
    free(x->loss_sum);
    fc_model_free(&x->m);
    mpiCheck(MPI_Comm_free(&x->shard));
    mpiCheck(MPI_Comm_free(&x->replica));
    if (x->post_fwd != MPI_COMM_NULL) mpiCheck(MPI_Comm_free(&x->post_fwd));
    free(x);
}

size_t fcx_host_live(const fcx *x) { return x->book.n; }

int fcx_host_violations(const fcx *x, const char **first) {
    if (first) *first = x->first;
    return x->violations;
}
