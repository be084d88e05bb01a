// reference/ckpt_reference.c — checkpoints of the reference. See ckpt_reference.h.
//
// The engine side works only through the engine's unit views (fsdp.h):
// what each rank stores of every unit, at which unit offsets.
//
//   FULL save      every unit is gathered to rank 0 (the export path), and
//                  rank 0 writes config.json, model.safetensors,
//                  optimizer.safetensors, then the manifest.
//   SHARDED save   rank 0 removes the old manifest and writes config.json;
//                  then every writer rank writes its own chunks (shard
//                  ranks of replica 0 for hybrid, every rank's W-way chunk
//                  for no_shard); sizes and hashes are gathered to rank 0,
//                  which writes the manifest last.
//   load           rank 0 verifies everything (SHA-256 included) and tells
//                  the others; each rank then opens the checkpoint itself
//                  (headers only) and reads just the elements it stores, so
//                  its memory stays O(shard); finally the step count.
#include "ckpt_reference.h"

#include <stdlib.h>
#include <string.h>

#include "mpicheck.h"
#include "optim.h"

// Every rank learns whether all ranks succeeded; if not, every rank's e gets
// the message of the lowest failing rank, so all of them report one reason.
static int agree(MPI_Comm comm, int ok, fc_error *e) {
    int rank, W, first;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    mpiCheck(MPI_Comm_size(comm, &W));
    int mine = ok ? W : rank;
    mpiCheck(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == W) return 0;
    mpiCheck(MPI_Bcast(e->msg, (int)sizeof e->msg, MPI_CHAR, first, comm));
    return -1;
}

// Fault ckpt_swap (DESIGN §9, --inject): two same-shaped tensors trade places
// in the state dict on load: the first two parameters of equal shape (gpt2's
// ln_1/ln_2 weights), every tensor of them; a model without such a pair
// (mlp-tiny) swaps parameter 0 with its first optimizer state.
typedef struct {
    int active, pa, pb, whole;  // whole: pa <-> pb for every tensor; else pa's tensors 0 <-> 1
} swap_fault;

static swap_fault pick_swap(const fc_model *m, int n_tensors) {
    swap_fault sw = {1, 0, 0, 0};
    for (int a = 0; a < m->n_params; a++)
        for (int b = a + 1; b < m->n_params; b++) {
            const fc_param *x = &m->params[a], *y = &m->params[b];
            if (x->ndim == y->ndim && x->shape[0] == y->shape[0] && x->shape[1] == y->shape[1])
                return (swap_fault){1, a, b, 1};
        }
    sw.active = n_tensors > 1;
    return sw;
}

// Reads elements [first, first+n) of unit u's tensor t into dst, parameter by
// parameter (so a fault can redirect one), from either checkpoint layout.
static int read_own(fc_ckpt *ck, const fc_model *m, int u, int t, size_t first, size_t n, float *dst,
                    const swap_fault *sw, fc_error *e) {
    const fc_unit *U = &m->units[u];
    size_t end = first + n;
    for (int k = 0; k < U->n_params; k++) {
        int p = m->unit_params[U->first_param + k];
        size_t a = m->params[p].unit_offset, b = a + m->params[p].numel;
        size_t lo = a > first ? a : first, hi = b < end ? b : end;
        if (lo >= hi) continue;
        int sp = p, st = t;  // the checkpoint tensor that fills (p, t)
        if (sw && sw->active && sw->whole && (p == sw->pa || p == sw->pb)) sp = p == sw->pa ? sw->pb : sw->pa;
        if (sw && sw->active && !sw->whole && p == sw->pa && t <= 1) st = 1 - t;
        if (fc_ckpt_read(ck, sp, st, lo - a, hi - lo, dst + (lo - first), e)) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// the FSDP engine

static int save_full(fc_fsdp *f, const fc_run_config *cfg, const char *dir, fc_error *e) {
    MPI_Comm comm = fc_fsdp_comm(f);
    int rank, W;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    mpiCheck(MPI_Comm_size(comm, &W));
    const fc_model *m = fc_fsdp_model(f);
    const char *names[2];
    int n_state = fc_optim_state_names(&cfg->optim, names);
    // rank 0 holds the full model while saving: [numel] params and each state
    float *params = NULL, *state[2] = {NULL, NULL};
    if (rank == 0) {
        params = mallocCheck(m->numel * sizeof(float));
        for (int s = 0; s < n_state; s++) state[s] = mallocCheck(m->numel * sizeof(float));
    }
    // the export gathers unit by unit to rank 0 (collective, same on every rank)
    int ok = fc_fsdp_export(f, FC_EXPORT_PARAMS, params, 0, e) == 0;
    for (int s = 0; ok && s < n_state; s++)
        ok = fc_fsdp_export(f, s ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, state[s], 0, e) == 0;
    if (ok && rank == 0) {
        fc_ckpt_info info = {cfg, m, fc_fsdp_steps(f), W, cfg->strategy};
        ok = fc_ckpt_save_full(dir, &info, params, (const float *const *)state, e) == 0;
    }
    free(params);
    free(state[0]);
    free(state[1]);
    return agree(comm, ok, e);
}

// What a writer rank sends rank 0 about its shard file.
typedef struct {
    int writer, ok;
    fc_ckpt_file file;
    char msg[sizeof(((fc_error *)0)->msg)];
} shard_report;

static int save_sharded(fc_fsdp *f, const fc_run_config *cfg, const char *dir, fc_error *e) {
    MPI_Comm comm = fc_fsdp_comm(f);
    int rank, W;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    mpiCheck(MPI_Comm_size(comm, &W));
    const fc_model *m = fc_fsdp_model(f);
    fc_ckpt_info info = {cfg, m, fc_fsdp_steps(f), W, cfg->strategy};
    fc_ckpt_file config_file;
    // no shard is written before the old manifest is gone
    int ok = rank != 0 || (fc_ckpt_prepare_dir(dir, e) == 0 && fc_ckpt_write_config(dir, &info, &config_file, e) == 0);
    if (agree(comm, ok, e)) return -1;

    fc_ckpt_chunk_data *chunks = callocCheck((size_t)m->n_units, sizeof *chunks);
    shard_report mine;
    memset(&mine, 0, sizeof mine);
    for (int u = 0; u < m->n_units; u++) {
        fc_fsdp_unit_view v;
        fc_fsdp_unit(f, u, &v);
        mine.writer = v.writer;  // the same for every unit
        // sharded: the shard holds [own_off, own_off+own_valid) at [0, own_valid);
        // no_shard: the full copy, of which this rank writes its W-way chunk
        size_t at = v.sharded ? 0 : v.own_off;
        chunks[u] = (fc_ckpt_chunk_data){u, v.own_off, v.own_valid, v.param + at,
                                         {v.state[0] ? v.state[0] + at : NULL, v.state[1] ? v.state[1] + at : NULL}};
    }
    mine.ok = 1;
    if (mine.writer) {
        fc_error we;
        mine.ok = fc_ckpt_write_shard(dir, rank, &info, chunks, m->n_units, &mine.file, &we) == 0;
        if (!mine.ok) memcpy(mine.msg, we.msg, sizeof mine.msg);
    }
    free(chunks);
    // every writer has renamed its file into place before it reports
    shard_report *all = rank == 0 ? mallocCheck((size_t)W * sizeof *all) : NULL;
    mpiCheck(MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, comm));
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
        if (ok) ok = fc_ckpt_write_manifest(dir, &info, FC_STATE_DICT_SHARDED, files, n, e) == 0;
        free(files);
    }
    free(all);
    return agree(comm, ok, e);
}

int fc_fsdp_ckpt_save(fc_fsdp *f, const fc_run_config *cfg, const char *dir, fc_state_dict kind, fc_error *e) {
    return kind == FC_STATE_DICT_FULL ? save_full(f, cfg, dir, e) : save_sharded(f, cfg, dir, e);
}

int fc_fsdp_ckpt_load(fc_fsdp *f, const fc_run_config *cfg, const char *dir, fc_error *e) {
    MPI_Comm comm = fc_fsdp_comm(f);
    int rank;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    fc_ckpt *ck = NULL;
    char sha[65] = "";
    // rank 0 verifies every file's SHA-256 and the whole structure
    int ok = 1;
    if (rank == 0) {
        ok = fc_ckpt_open(dir, 1, &ck, e) == 0 && fc_ckpt_check_compatible(ck, cfg, e) == 0;
        if (ok) memcpy(sha, fc_ckpt_manifest_sha256(ck), sizeof sha);
    }
    if (agree(comm, ok, e)) {
        fc_ckpt_close(ck);
        return -1;
    }
    // the others open the same checkpoint (headers only) and make sure it is
    // the same one: a manifest is rewritten by every save
    mpiCheck(MPI_Bcast(sha, (int)sizeof sha, MPI_CHAR, 0, comm));
    if (rank != 0) {
        ok = fc_ckpt_open(dir, 0, &ck, e) == 0 && fc_ckpt_check_compatible(ck, cfg, e) == 0;
        if (ok && strcmp(sha, fc_ckpt_manifest_sha256(ck)) != 0)
            ok = 0, fc_fail(e, "%s: the checkpoint changed while being loaded (a save into it?)", dir);
    }
    if (agree(comm, ok, e)) {
        fc_ckpt_close(ck);
        return -1;
    }
    // each rank reads exactly the elements it stores, straight into place
    const fc_model *m = fc_fsdp_model(f);
    int n_tensors = 1 + fc_ckpt_manifest_of(ck)->n_state;
    // the checkpoint faults of DESIGN §9, for the oracle to catch (P7)
    swap_fault sw = cfg->inject == FC_FAULT_CKPT_SWAP ? pick_swap(m, n_tensors) : (swap_fault){0, 0, 0, 0};
    if (cfg->inject == FC_FAULT_CKPT_DROP_OPTIM) n_tensors = 1;  // the state stays as created: zeros
    for (int u = 0; ok && u < m->n_units; u++) {
        fc_fsdp_unit_view v;
        fc_fsdp_unit(f, u, &v);
        size_t first = v.sharded ? v.own_off : 0, n = v.sharded ? v.own_valid : v.numel;
        float *dst[3] = {v.param, v.state[0], v.state[1]};
        for (int t = 0; ok && t < n_tensors; t++) {
            if (n) ok = read_own(ck, m, u, t, first, n, dst[t], &sw, e) == 0;
            // padding is never stored and stays zero (DESIGN §5)
            if (v.sharded && v.shard > n) memset(dst[t] + n, 0, (v.shard - n) * sizeof(float));
        }
    }
    long step = fc_ckpt_manifest_of(ck)->step;
    fc_ckpt_close(ck);
    if (agree(comm, ok, e)) return -1;
    // the step count drives AdamW's bias correction, SGD's first momentum step
    // and the data position (fault adam_step_reset: it restarts at 0)
    fc_fsdp_set_steps(f, cfg->inject == FC_FAULT_ADAM_STEP_RESET ? 0 : step);
    return 0;
}

// ---------------------------------------------------------------------------
// the one-process trainer

int fc_local_ckpt_save(fc_local *L, const char *dir, fc_state_dict kind, fc_error *e) {
    const fc_model *m = &L->model;
    fc_ckpt_info info = {&L->cfg, m, L->step, 1, FC_STRATEGY_LOCAL};
    if (kind == FC_STATE_DICT_FULL) return fc_ckpt_save_full(dir, &info, L->params, (const float *const *)L->state, e);
    // one shard file holding every unit whole
    fc_ckpt_file files[2];
    if (fc_ckpt_prepare_dir(dir, e) || fc_ckpt_write_config(dir, &info, &files[0], e)) return -1;
    fc_ckpt_chunk_data *chunks = callocCheck((size_t)m->n_units, sizeof *chunks);
    for (int u = 0; u < m->n_units; u++) {
        size_t off = m->units[u].offset;
        chunks[u] = (fc_ckpt_chunk_data){u, 0, m->units[u].numel, L->params + off,
                                         {L->state[0] ? L->state[0] + off : NULL, L->state[1] ? L->state[1] + off : NULL}};
    }
    int rc = fc_ckpt_write_shard(dir, 0, &info, chunks, m->n_units, &files[1], e);
    free(chunks);
    if (rc) return -1;
    return fc_ckpt_write_manifest(dir, &info, FC_STATE_DICT_SHARDED, files, 2, e);
}

int fc_local_ckpt_load(fc_local *L, const char *dir, fc_error *e) {
    fc_ckpt *ck;
    if (fc_ckpt_open(dir, 1, &ck, e)) return -1;
    int ok = fc_ckpt_check_compatible(ck, &L->cfg, e) == 0;
    const fc_model *m = &L->model;
    float *dst[3] = {L->params, L->state[0], L->state[1]};
    for (int t = 0; ok && t < 1 + L->n_state; t++)
        for (int u = 0; ok && u < m->n_units; u++)
            ok = read_own(ck, m, u, t, 0, m->units[u].numel, dst[t] + m->units[u].offset, NULL, e) == 0;
    if (ok) L->step = fc_ckpt_manifest_of(ck)->step;
    fc_ckpt_close(ck);
    return ok ? 0 : -1;
}
