// core/ckpt_collective.c — see ckpt_collective.h.
#include "ckpt_collective.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"
#include "mpiwait.h"
#include "optim.h"

// The first element of this rank's chunk within the view's storage.
static size_t chunk_at(const fc_ckpt_unit_view *u) { return u->full_copy ? u->own_off : 0; }

static int as_int(size_t n) {
    if (n > (size_t)0x7FFFFFFF) fc_die(FC_EXIT_INTERNAL, "%s:%d: a unit of %zu elements is too large for MPI", __FILE__, __LINE__, n);
    return (int)n;
}

// The pieces of the view's chunk at their storage offsets: its own, or the
// one range [own_off, own_off + own_valid); a full copy loads the whole unit.
static int view_pieces(const fc_ckpt_unit_view *U, int load, fc_piece *one, const fc_piece **out) {
    if (U->pieces) {
        *out = U->pieces;
        return U->n_pieces;
    }
    *one = load && U->full_copy ? (fc_piece){0, 0, U->numel} : (fc_piece){U->own_off, chunk_at(U), U->own_valid};
    *out = one;
    return 1;
}

// Tensor t (0 = param, 1.. = states) of unit u, gathered from the writers'
// chunks into dst (the unit's place in the full flat buffer) on rank 0: one
// gather per piece slot, each rank sending its k-th piece (or nothing).
static void gather_unit(const fc_ckpt_rank_view *v, int u, int t, float *dst, int *counts, int *displs) {
    const fc_ckpt_unit_view *U = &v->units[u];
    const float *src = t == 0 ? U->param : U->state[t - 1];
    fc_piece one;
    const fc_piece *pc;
    int n = view_pieces(U, 0, &one, &pc), slots = U->pieces ? U->max_pieces : 1;
    int rank, W;
    mpiCheck(MPI_Comm_rank(v->comm, &rank));
    mpiCheck(MPI_Comm_size(v->comm, &W));
    int *both = rank == 0 ? mallocCheck(2 * (size_t)W * sizeof(int)) : NULL;
    for (int k = 0; k < slots; k++) {
        int has = v->writer && k < n;
        int mine[2] = {has ? as_int(pc[k].count) : 0, has ? as_int(pc[k].unit_off) : 0};
        fc_mpi_gather(mine, 2, MPI_INT, both, 0, v->comm);
        if (rank == 0)
            for (int r = 0; r < W; r++) counts[r] = both[2 * r], displs[r] = both[2 * r + 1];
        const float *from = has ? src + pc[k].chunk_off : src;
        fc_mpi_gatherv(from, mine[0], MPI_FLOAT, dst, counts, displs, 0, v->comm);
    }
    free(both);
}

static int save_full(const fc_ckpt_rank_view *v, const char *dir, fc_error *e) {
    int rank, W;
    mpiCheck(MPI_Comm_rank(v->comm, &rank));
    mpiCheck(MPI_Comm_size(v->comm, &W));
    const fc_model *m = v->m;
    const char *names[2];
    int n_state = fc_optim_state_names(&v->cfg->optim, names);
    // rank 0 holds the full model while saving: [numel] params and each state
    float *full[3] = {NULL, NULL, NULL};
    int *counts = NULL, *displs = NULL;
    if (rank == 0) {
        for (int t = 0; t <= n_state; t++) full[t] = mallocCheck(m->numel * sizeof(float));
        counts = mallocCheck((size_t)W * sizeof(int));
        displs = mallocCheck((size_t)W * sizeof(int));
    }
    for (int t = 0; t <= n_state; t++)
        for (int u = 0; u < m->n_units; u++)
            gather_unit(v, u, t, full[t] ? full[t] + m->units[u].offset : NULL, counts, displs);
    int ok = 1;
    if (rank == 0) {
        fc_ckpt_info info = {v->cfg, m, v->step, W, v->strategy};
        const float *const state[2] = {full[1], full[2]};
        ok = fc_ckpt_save_full(dir, &info, full[0], state, e) == 0;
    }
    for (int t = 0; t < 3; t++) free(full[t]);
    free(counts);
    free(displs);
    return fc_mpi_agree(v->comm, ok, e);
}

// What a writer rank sends rank 0 about its shard file.
typedef struct {
    int writer, ok;
    fc_ckpt_file file;
    char msg[sizeof(((fc_error *)0)->msg)];
} shard_report;

// This rank's DCP file: each piece of its chunks is rows of one parameter
// (FSDP2's layout, core/layout_per_param.c), written as that block.
static int write_dcp(const fc_ckpt_rank_view *v, const char *dir, int rank, const fc_ckpt_info *info,
                     fc_ckpt_file *out, fc_error *e) {
    const fc_model *m = v->m;
    int cap = 0;
    for (int u = 0; u < m->n_units; u++) cap += v->units[u].n_pieces;
    fc_ckpt_rows *blocks = callocCheck((size_t)(cap ? cap : 1), sizeof *blocks);
    int n = 0;
    for (int u = 0; u < m->n_units; u++) {
        const fc_ckpt_unit_view *U = &v->units[u];
        for (int k = 0; k < U->n_pieces; k++) {
            const fc_piece *pc = &U->pieces[k];
            fc_ckpt_rows b = fc_ckpt_rows_of_piece(m, u, pc->unit_off, pc->count);
            b.data = U->param + pc->chunk_off;
            for (int s = 0; s < 2; s++) b.state[s] = U->state[s] ? U->state[s] + pc->chunk_off : NULL;
            blocks[n++] = b;
        }
    }
    int rc = fc_ckpt_write_dcp(dir, rank, info, blocks, n, rank == 0, v->skew_offsets, out, e);
    free(blocks);
    return rc;
}

static int save_sharded(const fc_ckpt_rank_view *v, const char *dir, fc_state_dict kind, fc_error *e) {
    int rank, W;
    mpiCheck(MPI_Comm_rank(v->comm, &rank));
    mpiCheck(MPI_Comm_size(v->comm, &W));
    const fc_model *m = v->m;
    fc_ckpt_info info = {v->cfg, m, v->step, W, v->strategy};
    fc_ckpt_file config_file;
    // no shard is written before the old manifest is gone
    int ok = rank != 0 || (fc_ckpt_prepare_dir(dir, e) == 0 && fc_ckpt_write_config(dir, &info, &config_file, e) == 0);
    if (fc_mpi_agree(v->comm, ok, e)) return -1;

    shard_report mine;
    memset(&mine, 0, sizeof mine);
    mine.writer = v->writer;
    mine.ok = 1;
    // a layout's own format: flat chunks split rows, FSDP2's rows are not one range
    fc_state_dict own = fc_ckpt_sharded_kind(v->cfg);
    if (kind != own) {
        mine.ok = 0;
        snprintf(mine.msg, sizeof mine.msg, "a %s checkpoint of %s shards: this layout saves %s ones", fc_state_dict_name(kind),
                 own == FC_STATE_DICT_DCP ? "FSDP2's per-parameter" : "FSDP1's flat", fc_state_dict_name(own));
    }
    if (v->writer && mine.ok && kind == FC_STATE_DICT_DCP) {
        fc_error we;
        mine.ok = write_dcp(v, dir, rank, &info, &mine.file, &we) == 0;
        if (!mine.ok) memcpy(mine.msg, we.msg, sizeof mine.msg);
    } else if (v->writer && mine.ok) {
        fc_ckpt_chunk_data *chunks = callocCheck((size_t)m->n_units, sizeof *chunks);
        for (int u = 0; u < m->n_units; u++) {
            const fc_ckpt_unit_view *U = &v->units[u];
            size_t at = chunk_at(U);
            chunks[u] = (fc_ckpt_chunk_data){u, U->own_off, U->own_valid, U->param + at,
                                             {U->state[0] ? U->state[0] + at : NULL, U->state[1] ? U->state[1] + at : NULL}};
        }
        fc_error we;
        mine.ok = fc_ckpt_write_shard(dir, rank, &info, chunks, m->n_units, &mine.file, &we) == 0;
        if (!mine.ok) memcpy(mine.msg, we.msg, sizeof mine.msg);
        free(chunks);
    }
    // every writer has renamed its file into place before it reports
    shard_report *all = rank == 0 ? mallocCheck((size_t)W * sizeof *all) : NULL;
    fc_mpi_gather(&mine, (int)sizeof mine, MPI_BYTE, all, 0, v->comm);
    ok = 1;
    if (rank == 0) {
        fc_ckpt_file *files = mallocCheck(((size_t)W + 1) * sizeof *files);
        int n = 0;
        files[n++] = config_file;
        for (int r = 0; r < W && ok; r++) {
            if (!all[r].ok) {
                ok = 0;
                fc_fail(e, "%s", all[r].msg);
            } else if (all[r].writer) {
                files[n++] = all[r].file;
            }
        }
        // the manifest last: only now is this a checkpoint
        if (ok) ok = fc_ckpt_write_manifest(dir, &info, kind, files, n, e) == 0;
        free(files);
    }
    free(all);
    return fc_mpi_agree(v->comm, ok, e);
}

int fc_ckpt_save_collective(const fc_ckpt_rank_view *v, const char *dir, fc_state_dict kind, fc_error *e) {
    return kind == FC_STATE_DICT_FULL ? save_full(v, dir, e) : save_sharded(v, dir, kind, e);
}

// Reads elements [first, first+n) of unit u's tensor t into dst, parameter by
// parameter (so a source function can redirect one), from either layout.
static int read_unit(fc_ckpt *ck, const fc_model *m, int u, int t, size_t first, size_t n, float *dst,
                     fc_ckpt_source_fn source, void *ctx, fc_error *e) {
    const fc_unit *U = &m->units[u];
    size_t end = first + n;
    for (int k = 0; k < U->n_params; k++) {
        int p = m->unit_params[U->first_param + k];
        size_t a = m->params[p].unit_offset, b = a + m->params[p].numel;
        size_t lo = a > first ? a : first, hi = b < end ? b : end;
        if (lo >= hi) continue;
        int sp = p, st = t;  // the checkpoint tensor that fills (p, t)
        if (source) source(ctx, p, t, &sp, &st);
        if (fc_ckpt_read(ck, sp, st, lo - a, hi - lo, dst + (lo - first), e)) return -1;
    }
    return 0;
}

int fc_ckpt_load_collective(const fc_ckpt_rank_view *v, const char *dir, fc_ckpt_source_fn source, void *ctx,
                            long *step, fc_error *e) {
    int rank;
    mpiCheck(MPI_Comm_rank(v->comm, &rank));
    fc_ckpt *ck = NULL;
    char sha[65] = "";
    // rank 0 verifies every file's SHA-256 and the whole structure
    int ok = 1;
    if (rank == 0) {
        ok = fc_ckpt_open(dir, 1, &ck, e) == 0 && fc_ckpt_check_compatible(ck, v->cfg, e) == 0;
        if (ok) memcpy(sha, fc_ckpt_manifest_sha256(ck), sizeof sha);
    }
    if (fc_mpi_agree(v->comm, ok, e)) {
        fc_ckpt_close(ck);
        return -1;
    }
    // the others open the same checkpoint (headers only) and make sure it is
    // the same one: a manifest is rewritten by every save
    fc_mpi_bcast(sha, (int)sizeof sha, MPI_CHAR, 0, v->comm);
    if (rank != 0) {
        ok = fc_ckpt_open(dir, 0, &ck, e) == 0 && fc_ckpt_check_compatible(ck, v->cfg, e) == 0;
        if (ok && strcmp(sha, fc_ckpt_manifest_sha256(ck)) != 0)
            ok = 0, fc_fail(e, "%s: the checkpoint changed while being loaded (a save into it?)", dir);
    }
    if (fc_mpi_agree(v->comm, ok, e)) {
        fc_ckpt_close(ck);
        return -1;
    }
    // each rank reads exactly the elements it stores, straight into place
    const fc_model *m = v->m;
    int n_tensors = 1 + fc_ckpt_manifest_of(ck)->n_state;
    for (int u = 0; ok && u < m->n_units; u++) {
        const fc_ckpt_unit_view *U = &v->units[u];
        fc_piece one;
        const fc_piece *pc;
        int n = view_pieces(U, 1, &one, &pc);
        float *dst[3] = {U->param, U->state[0], U->state[1]};
        for (int t = 0; ok && t < n_tensors; t++) {
            // padding is never stored and stays zero (docs/contract.md §5)
            memset(dst[t], 0, U->store * sizeof(float));
            for (int k = 0; ok && k < n; k++)
                if (pc[k].count)
                    ok = read_unit(ck, m, u, t, pc[k].unit_off, pc[k].count, dst[t] + pc[k].chunk_off, source, ctx,
                                   e) == 0;
        }
    }
    *step = fc_ckpt_manifest_of(ck)->step;
    fc_ckpt_close(ck);
    return fc_mpi_agree(v->comm, ok, e);
}
