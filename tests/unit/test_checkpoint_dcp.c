// tests/unit/test_checkpoint_dcp.c — FSDP2's SHARDED checkpoint in
// torch.distributed.checkpoint's Hugging Face safetensors layout (the "dcp"
// state dict, core/checkpoint.h), single process, no MPI:
//
//  - round trips: a model's every parameter and optimizer state, crafted so
//    that every element of every tensor is distinct (element i of parameter
//    p's tensor t is t*1000000 + p*10000 + i, exact in F32), written at W
//    ranks with FSDP2's rows (fc_layout_of(FC_LAYOUT_PER_PARAM)->pieces and
//    fc_ckpt_rows_of_piece, as `ckpt convert --to dcp` does), read back
//    exactly by fc_ckpt_read and fc_ckpt_read_unit, whole and in ranges
//    across block boundaries; at W where trailing ranks hold no rows (0-row
//    blocks skipped by the writer, files with no tensor at all), and with the
//    [0, cols] tensors at saved_offsets [rows, 0] torch writes for them;
//  - refusals: hand-made files (fc_st_write, listed in a manifest with their
//    true sizes and SHA-256, so that only the DCP structure is wrong) with
//    one thing broken each: fc_ckpt_open returns -1 with one line naming
//    the problem;
//  - the file name parser fc_ckpt_dcp_index;
//  - `fsdpcheck ckpt convert --to dcp` writes what fc_ckpt_write_dcp writes.
#include <criterion/criterion.h>

#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_internal.h"
#include "config.h"
#include "layout.h"
#include "model.h"
#include "optim.h"
#include "safetensors.h"

#define RUN_TIMEOUT_S 60
#include "cli_harness.h"

static void setup(void) { tmp_setup("fc_test_ckpt_dcp"); }

TestSuite(dcp, .init = setup, .fini = tmp_teardown, .timeout = 120);

// ----------------------------------------------------------------------------
// a model, a run config and the crafted values

typedef struct {
    fc_run_config cfg;
    fc_model m;
    fc_ckpt_info info;  // points into this struct: never copied
    int n_state;
    const char *names[2];
} ctx;

static void ctx_init(ctx *x, const char *model, fc_opt_kind opt, double momentum, long step) {
    fc_error e;
    fc_run_config_defaults(&x->cfg);
    cr_assert_eq(fc_model_config_load(model, &x->cfg.model, &e), 0, "%s", e.msg);
    x->cfg.strategy = FC_STRATEGY_FULL_SHARD;
    x->cfg.fsdp_version = 2;
    x->cfg.divide = fc_default_divide(&x->cfg);
    x->cfg.optim.kind = opt;
    x->cfg.optim.momentum = momentum;
    fc_model_build(&x->m, &x->cfg.model);
    x->info = (fc_ckpt_info){&x->cfg, &x->m, step, 1, FC_STRATEGY_FULL_SHARD};
    x->n_state = fc_optim_state_names(&x->cfg.optim, x->names);
}

static void ctx_free(ctx *x) { fc_model_free(&x->m); }

// Element i of parameter p's tensor t (0 = the parameter, 1.. its states).
static float val(int p, int t, size_t i) { return (float)(t * 1000000L + p * 10000L + (long)i); }

static size_t cols_of(const fc_param *P) { return P->numel / (size_t)P->shape[0]; }

static const char *dcp_name(int rank) {
    static char bufs[4][64];
    static int next;
    char *b = bufs[next++ % 4];
    fc_ckpt_dcp_name(rank, b, 64);
    return b;
}

// ----------------------------------------------------------------------------
// writing with the checkpoint writer

// A DCP checkpoint of x's model at W ranks, FSDP2's rows of every unit as
// `ckpt convert --to dcp` writes them, with the crafted values. empty_blocks:
// every rank's list also gets a 0-row block of every parameter (at row
// `rows`, no data), which the writer must skip. skew: fc_ckpt_write_dcp's
// skew_offsets. Returns the number of non-empty blocks written.
static int write_dcp(ctx *x, const char *dir, int W, int empty_blocks, int skew) {
    const fc_model *m = &x->m;
    const fc_layout_ops *lay = fc_layout_of(FC_LAYOUT_PER_PARAM);
    int nt = 1 + x->n_state, cap = 2 * m->n_params + 1, written = 0;
    x->info.world_size = W;
    fc_ckpt_file *files = calloc((size_t)W + 1, sizeof *files);
    fc_ckpt_rows *blocks = calloc((size_t)cap, sizeof *blocks);
    fc_piece *pc = calloc((size_t)m->n_params + 1, sizeof *pc);
    float **bufs = calloc((size_t)(cap * nt), sizeof *bufs);
    cr_assert(files && blocks && pc && bufs);
    fc_error e;
    cr_assert_eq(fc_ckpt_prepare_dir(dir, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_ckpt_write_config(dir, &x->info, &files[0], &e), 0, "%s", e.msg);
    for (int r = 0; r < W; r++) {
        int n = 0;
        if (empty_blocks)  // first, so that skipping them must not disturb the others
            for (int p = 0; p < m->n_params; p++)
                blocks[n++] = (fc_ckpt_rows){p, (size_t)m->params[p].shape[0], 0, NULL, {NULL, NULL}};
        for (int u = 0; u < m->n_units; u++) {
            int np = lay->pieces(m, u, W, r, pc);
            for (int k = 0; k < np; k++, n++) {
                fc_ckpt_rows *B = &blocks[n];
                *B = fc_ckpt_rows_of_piece(m, u, pc[k].unit_off, pc[k].count);
                const fc_param *P = &m->params[B->param];
                size_t cols = cols_of(P);
                cr_assert_eq(P->unit, u);
                cr_assert_eq(P->unit_offset + B->row0 * cols, pc[k].unit_off);
                cr_assert_eq(B->rows * cols, pc[k].count);
                for (int t = 0; t < nt; t++) {
                    float *b = bufs[n * nt + t] = malloc(pc[k].count * sizeof(float));
                    cr_assert_not_null(b);
                    for (size_t i = 0; i < pc[k].count; i++) b[i] = val(B->param, t, B->row0 * cols + i);
                    if (t == 0) B->data = b;
                    else B->state[t - 1] = b;
                }
                written++;
            }
        }
        cr_assert_eq(fc_ckpt_write_dcp(dir, r, &x->info, blocks, n, r == 0, skew, &files[1 + r], &e), 0, "%s",
                     e.msg);
        cr_assert_str_eq(files[1 + r].name, dcp_name(r));
        for (int k = 0; k < cap * nt; k++) free(bufs[k]), bufs[k] = NULL;
    }
    cr_assert_eq(fc_ckpt_write_manifest(dir, &x->info, FC_STATE_DICT_DCP, files, W + 1, &e), 0, "%s", e.msg);
    free(bufs);
    free(pc);
    free(blocks);
    free(files);
    return written;
}

// ----------------------------------------------------------------------------
// reading back

// Every element of every parameter and state, whole and in a range, and
// every unit through fc_ckpt_read_unit, are exactly the crafted values, and
// a read costs exactly its bytes.
static void expect_values(const ctx *x, fc_ckpt *c) {
    const fc_model *m = fc_ckpt_model(c);
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    int nt = 1 + x->n_state;
    cr_assert_eq(m->n_params, x->m.n_params);
    cr_assert_eq(man->n_state, x->n_state);
    cr_expect_str_eq(fc_ckpt_tensor_name(c, 0), "param");
    for (int s = 0; s < x->n_state; s++) {
        cr_expect_eq(fc_ckpt_tensor_index(c, x->names[s]), 1 + s);
        cr_expect_str_eq(fc_ckpt_tensor_name(c, 1 + s), x->names[s]);
    }
    cr_expect_eq(fc_ckpt_tensor_index(c, "step"), -1, "the step is no tensor of a parameter");
    size_t most = 0;
    for (int u = 0; u < m->n_units; u++)
        if (m->units[u].numel > most) most = m->units[u].numel;
    float *buf = malloc(most * sizeof(float));
    cr_assert_not_null(buf);
    fc_error e;
    for (int t = 0; t < nt; t++)
        for (int p = 0; p < m->n_params; p++) {
            size_t n = m->params[p].numel;
            memset(buf, 0xff, most * sizeof(float));  // NaN: nothing left unwritten passes
            uint64_t before = fc_ckpt_bytes_read(c);
            cr_assert_eq(fc_ckpt_read(c, p, t, 0, n, buf, &e), 0, "%s", e.msg);
            cr_expect_eq(fc_ckpt_bytes_read(c) - before, n * sizeof(float), "%s: read more than the tensor",
                         m->params[p].name);
            for (size_t i = 0; i < n; i++)
                if (buf[i] != val(p, t, i)) {
                    cr_expect_fail("%s tensor %d element %zu: %.1f, want %.1f", m->params[p].name, t, i,
                                   (double)buf[i], (double)val(p, t, i));
                    break;
                }
            // a range that starts and ends inside blocks
            size_t first = n / 3, cnt = (n - first + 1) / 2;
            memset(buf, 0xff, most * sizeof(float));
            before = fc_ckpt_bytes_read(c);
            cr_assert_eq(fc_ckpt_read(c, p, t, first, cnt, buf, &e), 0, "%s", e.msg);
            cr_expect_eq(fc_ckpt_bytes_read(c) - before, cnt * sizeof(float));
            for (size_t i = 0; i < cnt; i++)
                if (buf[i] != val(p, t, first + i)) {
                    cr_expect_fail("%s tensor %d element %zu (range from %zu): %.1f, want %.1f", m->params[p].name,
                                   t, first + i, first, (double)buf[i], (double)val(p, t, first + i));
                    break;
                }
        }
    for (int t = 0; t < nt; t++)
        for (int u = 0; u < m->n_units; u++) {
            const fc_unit *U = &m->units[u];
            size_t ranges[2][2] = {{0, U->numel}, {U->numel / 4, U->numel / 2}};
            for (int k = 0; k < 2; k++) {
                size_t first = ranges[k][0], cnt = ranges[k][1];
                memset(buf, 0xff, most * sizeof(float));
                cr_assert_eq(fc_ckpt_read_unit(c, u, t, first, cnt, buf, &e), 0, "%s", e.msg);
                for (size_t i = 0; i < cnt; i++) {
                    size_t at = first + i;
                    int p = -1;
                    for (int q = 0; q < U->n_params && p < 0; q++) {
                        int pi = m->unit_params[U->first_param + q];
                        if (at >= m->params[pi].unit_offset && at < m->params[pi].unit_offset + m->params[pi].numel)
                            p = pi;
                    }
                    cr_assert_geq(p, 0);
                    float want = val(p, t, at - m->params[p].unit_offset);
                    if (buf[i] != want) {
                        cr_expect_fail("unit %d tensor %d element %zu: %.1f, want %.1f", u, t, at, (double)buf[i],
                                       (double)want);
                        break;
                    }
                }
            }
        }
    // out of range is refused
    cr_expect_eq(fc_ckpt_read(c, 0, 0, m->params[0].numel, 1, buf, &e), -1);
    cr_expect_eq(fc_ckpt_read(c, 0, nt, 0, 1, buf, &e), -1);
    cr_expect_eq(fc_ckpt_read_unit(c, 0, 0, m->units[0].numel, 1, buf, &e), -1);
    free(buf);
}

static fc_ckpt *open_ok(const char *dir) {
    fc_ckpt *c = NULL;
    fc_error e;
    cr_assert_eq(fc_ckpt_open(dir, 1, &c, &e), 0, "%s: %s", dir, e.msg);
    cr_assert_not_null(c);
    return c;
}

// The listing of a DCP checkpoint of W files.
static void expect_dcp_listing(const char *dir, int W) {
    char want[8192] = "config.json fsdpcheck.json";
    for (int r = 0; r < W; r++) {
        size_t k = strlen(want);
        snprintf(want + k, sizeof want - k, " %s", dcp_name(r));
    }
    expect_listing(dir, want);
}

// DCP_SHARDING_INFO's saved_offsets of tensor `name` in st as text ("[33,0]"), NULL without.
static char *offsets_of(const fc_st_file *st, const char *name) {
    const char *info = fc_st_meta(st, "DCP_SHARDING_INFO");
    cr_assert_not_null(info);
    cJSON *j = cJSON_Parse(info);
    cr_assert_not_null(j);
    cJSON *off = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, name), "saved_offsets");
    char *s = off ? cJSON_PrintUnformatted(off) : NULL;
    cJSON_Delete(j);
    return s;
}

static void expect_offsets(const fc_st_file *st, const char *name, const char *want) {
    char *s = offsets_of(st, name);
    cr_expect(s && strcmp(s, want) == 0, "%s: saved_offsets %s, want %s", name, s ? s : "(none)", want);
    cJSON_free(s);
}

// ----------------------------------------------------------------------------
// 1. round trips

Test(dcp, round_trip_gpt2_tiny_adamw_w3) {
    ctx x;
    ctx_init(&x, "gpt2-tiny", FC_OPT_ADAMW, 0.9, 7);
    const char *dir = tmp_path("ck");
    int blocks = write_dcp(&x, dir, 3, 0, 0);
    cr_expect_eq(blocks, 3 * x.m.n_params, "gpt2-tiny has at least 3 rows in every parameter");
    expect_dcp_listing(dir, 3);
    fc_ckpt *c = open_ok(dir);
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    cr_expect_eq(man->kind, FC_STATE_DICT_DCP);
    cr_expect_eq(man->world_size, 3);
    cr_expect_eq(man->strategy, FC_STRATEGY_FULL_SHARD);
    cr_expect_eq(man->step, 7);
    cr_expect_eq(man->n_files, 4);
    expect_values(&x, c);
    // the files as torch writes them: format, version, the blocks' offsets,
    // and every step, F32 7.0, in the first file only
    int wte = fc_model_find(&x.m, "transformer.wte.weight"), ln = fc_model_find(&x.m, "transformer.h.1.ln_2.bias");
    cr_assert(wte >= 0 && ln >= 0);
    for (int r = 0; r < 3; r++) {
        const fc_st_file *st = fc_ckpt_st(c, dcp_name(r));
        cr_assert_not_null(st);
        cr_expect_str_eq(fc_st_meta(st, "format"), "pt");
        cr_expect_str_eq(fc_st_meta(st, "DCP_VERSION"), "1.0");
        cr_expect_eq(st->n_meta, 3);
        cr_expect_eq(st->n_tensors, 3 * x.m.n_params + (r == 0 ? x.m.n_params : 0));
        // wte [97, 16]: torch.chunk's 33 rows, 33, 31
        const fc_st_tensor *t = fc_st_find(st, "transformer.wte.weight");
        cr_assert_not_null(t);
        cr_expect(t->dtype == FC_DT_F32 && t->ndim == 2 && t->shape[0] == (r < 2 ? 33u : 31u) && t->shape[1] == 16);
        cr_expect_not_null(fc_st_find(st, "state.transformer.wte.weight.exp_avg_sq"));
        char want[32];
        snprintf(want, sizeof want, "[%d,0]", 33 * r);
        expect_offsets(st, "transformer.wte.weight", want);
        expect_offsets(st, "state.transformer.wte.weight.exp_avg", want);
        // a 1-D parameter of 16: 6, 6, 4 elements, one offset
        t = fc_st_find(st, "transformer.h.1.ln_2.bias");
        cr_assert_not_null(t);
        cr_expect(t->ndim == 1 && t->shape[0] == (r < 2 ? 6u : 4u));
        snprintf(want, sizeof want, "[%d]", 6 * r);
        expect_offsets(st, "state.transformer.h.1.ln_2.bias.exp_avg_sq", want);
        for (int p = 0; p < x.m.n_params; p++) {
            char name[160];
            snprintf(name, sizeof name, "state.%s.step", x.m.params[p].name);
            t = fc_st_find(st, name);
            if (r > 0) {
                cr_expect_null(t, "%s in file %d", name, r);
                continue;
            }
            cr_assert_not_null(t, "%s missing", name);
            cr_expect(t->dtype == FC_DT_F32 && t->ndim == 0);
            float v = 0;
            fc_error e;
            cr_assert_eq(fc_st_read((fc_st_file *)st, t, 0, 1, &v, &e), 0, "%s", e.msg);
            cr_expect_eq(v, 7.0f);
            expect_offsets(st, name, "[]");
        }
    }
    fc_ckpt_close(c);
    ctx_free(&x);
}

Test(dcp, round_trip_sgd) {
    // momentum: one state, no step tensor anywhere
    ctx x;
    ctx_init(&x, "mlp-tiny", FC_OPT_SGD, 0.9, 4);
    cr_assert_eq(x.n_state, 1);
    const char *dir = tmp_path("ck");
    write_dcp(&x, dir, 2, 0, 0);
    fc_ckpt *c = open_ok(dir);
    expect_values(&x, c);
    for (int r = 0; r < 2; r++) {
        const fc_st_file *st = fc_ckpt_st(c, dcp_name(r));
        cr_assert_not_null(st);
        cr_expect_eq(st->n_tensors, 2 * x.m.n_params);
        for (int k = 0; k < st->n_tensors; k++)
            cr_expect_null(strstr(st->tensors[k].name, ".step"), "%s under SGD", st->tensors[k].name);
    }
    fc_ckpt_close(c);
    ctx_free(&x);
    // no momentum: the parameters alone
    ctx y;
    ctx_init(&y, "mlp-tiny", FC_OPT_SGD, 0.0, 4);
    cr_assert_eq(y.n_state, 0);
    dir = tmp_path("ck0");
    write_dcp(&y, dir, 3, 0, 0);
    c = open_ok(dir);
    expect_values(&y, c);
    cr_expect_eq(fc_ckpt_st(c, dcp_name(0))->n_tensors, y.m.n_params);
    fc_ckpt_close(c);
    ctx_free(&y);
}

Test(dcp, round_trip_trailing_ranks_without_rows) {
    // W=7: a 16-row parameter is torch.chunk'ed 3, 3, 3, 3, 3, 1, 0, a
    // 32-row one 5 x 6 and 2; the writer gets 0-row blocks too and skips them
    ctx x;
    ctx_init(&x, "gpt2-tiny", FC_OPT_ADAMW, 0.9, 3);
    const char *dir = tmp_path("w7");
    write_dcp(&x, dir, 7, 1, 0);
    fc_ckpt *c = open_ok(dir);
    expect_values(&x, c);
    for (int r = 0; r < 7; r++) {
        const fc_st_file *st = fc_ckpt_st(c, dcp_name(r));
        cr_assert_not_null(st);
        for (int k = 0; k < st->n_tensors; k++)
            cr_expect(st->tensors[k].ndim == 0 || st->tensors[k].shape[0] > 0, "%s: a 0-row block written to %s",
                      st->tensors[k].name, dcp_name(r));
    }
    const fc_st_file *last = fc_ckpt_st(c, dcp_name(6));
    cr_expect_null(fc_st_find(last, "transformer.h.0.ln_1.weight"), "rank 6 holds no row of a 16-row parameter");
    cr_expect_not_null(fc_st_find(last, "transformer.wpe.weight"));
    fc_ckpt_close(c);
    // W=70: ranks 64..69 hold no row of any parameter (64 rows at most but
    // wte's 97 in chunks of 2): files without a tensor, still listed
    dir = tmp_path("w70");
    write_dcp(&x, dir, 70, 1, 0);
    expect_dcp_listing(dir, 70);
    c = open_ok(dir);
    cr_expect_eq(fc_ckpt_manifest_of(c)->n_files, 71);
    for (int r = 64; r < 70; r++) {
        const fc_st_file *st = fc_ckpt_st(c, dcp_name(r));
        cr_assert_not_null(st);
        cr_expect_eq(st->n_tensors, 0, "%s holds %d tensors", dcp_name(r), st->n_tensors);
        cr_expect_str_eq(fc_st_meta(st, "DCP_SHARDING_INFO"), "{}");
    }
    expect_values(&x, c);
    fc_ckpt_close(c);
    ctx_free(&x);
}

Test(dcp, skewed_saved_offsets_refused) {
    // the fault catalogue's dcp_saved_offsets: every block but the first one
    // row early, so each overlaps the block before it
    ctx x;
    ctx_init(&x, "gpt2-tiny", FC_OPT_ADAMW, 0.9, 2);
    const char *dir = tmp_path("skew");
    write_dcp(&x, dir, 3, 0, 1);
    fc_ckpt *c = (fc_ckpt *)1;
    fc_error e;
    cr_assert_eq(fc_ckpt_open(dir, 1, &c, &e), -1);
    cr_expect_null(c);
    cr_expect_not_null(strstr(e.msg, "in two shard files"), "%s", e.msg);
    ctx_free(&x);
}

// ----------------------------------------------------------------------------
// hand-made DCP files (mlp-micro: layers.0.weight [2, 3], layers.0.bias [2],
// layers.1.weight [2, 2], layers.1.bias [2])

#define MAX_HT 48

typedef struct {
    char name[160];
    fc_dtype dtype;
    int ndim;
    uint64_t shape[2];
    char off[64];    // its DCP_SHARDING_INFO entry ("{\"saved_offsets\": [0, 0]}"); "" = none
    float data[16];  // numel elements (F32), or their first bytes (another dtype)
} ht;

typedef struct {
    char name[FC_CKPT_MAX_NAME];
    ht t[MAX_HT];
    int n;
    const char *format, *version;  // NULL: the key is absent
    const char *info;              // DCP_SHARDING_INFO as given; NULL: built from the entries
    int no_info;                   // no DCP_SHARDING_INFO at all
    char extra[256];               // more members of the built DCP_SHARDING_INFO (",\"x\": {...}")
} hfile;

typedef struct {
    ctx x;
    int W;       // the manifest's world size
    int n_files;
    hfile f[4];
} hset;

static ht *hfind(hfile *f, const char *name) {
    for (int k = 0; k < f->n; k++)
        if (!strcmp(f->t[k].name, name)) return &f->t[k];
    cr_assert_fail("%s: no tensor %s", f->name, name);
    return NULL;
}

static void hdrop(hfile *f, const char *name) {
    ht *t = hfind(f, name);
    int k = (int)(t - f->t);
    memmove(&f->t[k], &f->t[k + 1], (size_t)(f->n - k - 1) * sizeof *t);
    f->n--;
}

static ht *hadd(hfile *f, const char *name, int ndim, uint64_t rows, uint64_t cols, const char *offsets) {
    cr_assert_lt(f->n, MAX_HT);
    ht *t = &f->t[f->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = FC_DT_F32;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
    if (offsets) snprintf(t->off, sizeof t->off, "{\"saved_offsets\": %s}", offsets);
    return t;
}

static uint64_t ht_numel(const ht *t) {
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

// torch's files of mlp-micro at W ranks: rank r holds rows [r*c, ...) of
// every parameter (c = ceil(rows / W)), and every state of them; a rank past
// the rows writes a [0, cols] block at saved_offsets [rows, 0] when
// torch_empty, else nothing; AdamW's steps are in the first file.
static void hset_init(hset *h, fc_opt_kind opt, int W, int torch_empty) {
    memset(h, 0, sizeof *h);
    ctx_init(&h->x, "mlp-micro", opt, 0.9, 2);
    const fc_model *m = &h->x.m;
    cr_assert_leq(W, 4);
    h->W = h->n_files = W;
    for (int r = 0; r < W; r++) {
        hfile *f = &h->f[r];
        snprintf(f->name, sizeof f->name, "%s", dcp_name(r));
        f->format = "pt";
        f->version = "1.0";
        for (int p = 0; p < m->n_params; p++) {
            const fc_param *P = &m->params[p];
            uint64_t rows = (uint64_t)P->shape[0], cols = cols_of(P), c = (rows + (uint64_t)W - 1) / (uint64_t)W;
            uint64_t r0 = (uint64_t)r * c, n = r0 >= rows ? 0 : (rows - r0 < c ? rows - r0 : c);
            if (n == 0 && !torch_empty) continue;
            if (n == 0) r0 = rows;
            char off[64];
            if (P->ndim == 2) snprintf(off, sizeof off, "[%llu, 0]", (unsigned long long)r0);
            else snprintf(off, sizeof off, "[%llu]", (unsigned long long)r0);
            for (int t = 0; t <= h->x.n_state; t++) {
                char name[160];
                if (t == 0) snprintf(name, sizeof name, "%s", P->name);
                else snprintf(name, sizeof name, "state.%s.%s", P->name, h->x.names[t - 1]);
                ht *T = hadd(f, name, P->ndim, n, cols, off);
                for (uint64_t i = 0; i < n * cols; i++) T->data[i] = val(p, t, r0 * cols + i);
            }
        }
        if (r == 0 && opt == FC_OPT_ADAMW)
            for (int p = 0; p < m->n_params; p++) {
                char name[160];
                snprintf(name, sizeof name, "state.%s.step", m->params[p].name);
                hadd(f, name, 0, 0, 0, "[]")->data[0] = 2.0f;
            }
    }
}

static void hset_free(hset *h) { ctx_free(&h->x); }

// DCP_SHARDING_INFO of f as its entries and extra make it.
static char *built_info(const hfile *f) {
    size_t cap = 256 + sizeof f->extra, len = 0;
    for (int k = 0; k < f->n; k++) cap += strlen(f->t[k].name) + strlen(f->t[k].off) + 8;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    len += (size_t)snprintf(s + len, cap - len, "{");
    int first = 1;
    for (int k = 0; k < f->n; k++) {
        if (!f->t[k].off[0]) continue;
        len += (size_t)snprintf(s + len, cap - len, "%s\"%s\": %s", first ? "" : ", ", f->t[k].name, f->t[k].off);
        first = 0;
    }
    const char *extra = f->extra;
    if (first && extra[0] == ',') extra++;
    snprintf(s + len, cap - len, "%s}", extra);
    return s;
}

// Writes the set as a checkpoint in dir: config.json, the files, and a
// manifest with their true sizes and hashes.
static const char *hset_write(hset *h, const char *name) {
    const char *dir = tmp_path("%s", name);
    char dirbuf[1024];
    snprintf(dirbuf, sizeof dirbuf, "%s", dir);
    fc_error e;
    fc_ckpt_file files[5];
    cr_assert_eq(fc_ckpt_prepare_dir(dirbuf, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_ckpt_write_config(dirbuf, &h->x.info, &files[0], &e), 0, "%s", e.msg);
    for (int i = 0; i < h->n_files; i++) {
        hfile *f = &h->f[i];
        fc_st_entry ent[MAX_HT];
        for (int k = 0; k < f->n; k++) {
            const ht *t = &f->t[k];
            cr_assert_leq(ht_numel(t) * fc_dtype_size(t->dtype), sizeof t->data);
            ent[k] = (fc_st_entry){t->name, t->dtype, t->ndim, {t->shape[0], t->shape[1]}, t->data};
        }
        char *info = f->info ? NULL : built_info(f);
        fc_st_meta_kv meta[3];
        int nm = 0;
        if (f->format) meta[nm++] = (fc_st_meta_kv){"format", (char *)f->format};
        if (f->version) meta[nm++] = (fc_st_meta_kv){"DCP_VERSION", (char *)f->version};
        if (!f->no_info) meta[nm++] = (fc_st_meta_kv){"DCP_SHARDING_INFO", f->info ? (char *)f->info : info};
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dirbuf, f->name);
        cr_assert_eq(fc_st_write(path, ent, f->n, meta, nm, &e), 0, "%s: %s", f->name, e.msg);
        free(info);
        snprintf(files[1 + i].name, sizeof files[1 + i].name, "%s", f->name);
        cr_assert_eq(fc_sha256_file(path, &files[1 + i].bytes, files[1 + i].sha256, &e), 0, "%s", e.msg);
    }
    h->x.info.world_size = h->W;
    cr_assert_eq(fc_ckpt_write_manifest(dirbuf, &h->x.info, FC_STATE_DICT_DCP, files, 1 + h->n_files, &e), 0, "%s",
                 e.msg);
    return tmp_path("%s", name);
}

// fc_ckpt_open refuses dir with one line holding each of want (NULL-terminated).
static void expect_refused(const char *dir, const char *const *want) {
    fc_ckpt *c = (fc_ckpt *)1;
    fc_error e;
    memset(&e, 0, sizeof e);
    int rc = fc_ckpt_open(dir, 1, &c, &e);
    cr_assert_eq(rc, -1, "%s: opened, want refused with '%s'", dir, want[0]);
    cr_expect_null(c);
    cr_expect_null(strchr(e.msg, '\n'), "not one line: %s", e.msg);
    for (int i = 0; want[i]; i++) cr_expect_not_null(strstr(e.msg, want[i]), "'%s' not in: %s", want[i], e.msg);
}
#define REFUSED(dir, ...) expect_refused((dir), ARGS(__VA_ARGS__))

// The hand-made set opens and reads back exactly: what each refusal breaks
// was fine before.
static void expect_hset_ok(hset *h, const char *name) {
    fc_ckpt *c = open_ok(hset_write(h, name));
    expect_values(&h->x, c);
    fc_ckpt_close(c);
}

#define F1 "shard-00001-model-00001-of-00001.safetensors"
#define F2 "shard-00002-model-00001-of-00001.safetensors"

Test(dcp, hand_made_files_open) {
    for (int W = 1; W <= 3; W++)
        for (int opt = 0; opt < 2; opt++) {
            hset h;
            hset_init(&h, opt ? FC_OPT_SGD : FC_OPT_ADAMW, W, 0);
            expect_hset_ok(&h, "good");
            hset_free(&h);
        }
}

Test(dcp, torch_empty_trailing_shards_accepted) {
    // W=3 over 2 rows: rank 2 holds [0, 3] layers.0.weight at saved_offsets
    // [2, 0] and [0] biases at [2], as torch writes empty shards
    hset h;
    hset_init(&h, FC_OPT_ADAMW, 3, 1);
    ht *t = hfind(&h.f[2], "state.layers.0.weight.exp_avg");
    cr_assert(t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3);
    cr_assert_str_eq(t->off, "{\"saved_offsets\": [2, 0]}");
    cr_assert_str_eq(hfind(&h.f[2], "layers.1.bias")->off, "{\"saved_offsets\": [2]}");
    cr_assert_eq(h.f[2].n, 12);
    const char *dir = hset_write(&h, "empty");
    fc_ckpt *c = open_ok(dir);
    expect_values(&h.x, c);
    fc_ckpt_close(c);
    // the same from memory
    const char *names[] = {FC_CKPT_MANIFEST, "config.json", F1, F2, "shard-00003-model-00001-of-00001.safetensors"};
    fc_ckpt_mem_file mem[5];
    unsigned char *bufs[5];
    for (int i = 0; i < 5; i++) {
        size_t n;
        bufs[i] = read_all(tmp_path("empty/%s", names[i]), &n);
        mem[i] = (fc_ckpt_mem_file){names[i], bufs[i], n};
    }
    fc_error e;
    cr_assert_eq(fc_ckpt_open_mem(mem, 5, 1, &c, &e), 0, "%s", e.msg);
    expect_values(&h.x, c);
    fc_ckpt_close(c);
    for (int i = 0; i < 5; i++) free(bufs[i]);
    // an empty block anywhere but past the rows is still placed: at [3, 0]
    // it is outside the tensor's 2 rows
    snprintf(hfind(&h.f[2], "layers.0.weight")->off, sizeof t->off, "{\"saved_offsets\": [3, 0]}");
    REFUSED(hset_write(&h, "empty_outside"), "layers.0.weight", "outside");
    hset_free(&h);
}

// ----------------------------------------------------------------------------
// 2. refusals (mlp-micro at W=2 unless said: each file one row of everything)

// A fresh W=2 set of the optimizer opt (the one before it freed);
// base_done frees the last.
static hset g_base;
static int g_base_live;

static hset *base(fc_opt_kind opt) {
    if (g_base_live) hset_free(&g_base);
    hset_init(&g_base, opt, 2, 0);
    g_base_live = 1;
    return &g_base;
}

static void base_done(void) {
    if (g_base_live) hset_free(&g_base);
    g_base_live = 0;
}

static void set_off(hfile *f, const char *name, const char *offsets) {
    snprintf(hfind(f, name)->off, sizeof f->t[0].off, "{\"saved_offsets\": %s}", offsets);
}

Test(dcp, blocks_that_do_not_tile_refused) {
    hset *h = base(FC_OPT_ADAMW);
    // rank 1's row of layers.0.weight recorded as row 0: rank 0's row twice, row 1 in no file
    set_off(&h->f[1], "layers.0.weight", "[0, 0]");
    REFUSED(hset_write(h, "overlap"), "layers.0.weight", "param", "in two shard files", F1, F2);
    // rank 1 holding both rows of a state
    h = base(FC_OPT_ADAMW);
    ht *t = hfind(&h->f[1], "state.layers.1.weight.exp_avg_sq");
    t->shape[0] = 2;
    set_off(&h->f[1], "state.layers.1.weight.exp_avg_sq", "[0, 0]");
    REFUSED(hset_write(h, "overlap2"), "layers.1.weight", "exp_avg_sq", "in two shard files");
    // a gap at the end: rank 1 without layers.0.bias
    h = base(FC_OPT_ADAMW);
    hdrop(&h->f[1], "layers.0.bias");
    REFUSED(hset_write(h, "gap_end"), "elements [1, 2) of layers.0.bias param", "in no shard file");
    // a gap at the start: rank 0 without a state's row
    h = base(FC_OPT_ADAMW);
    hdrop(&h->f[0], "state.layers.1.weight.exp_avg");
    REFUSED(hset_write(h, "gap_start"), "elements [0, 2) of layers.1.weight exp_avg", "in no shard file");
    // a parameter's first row in no file
    h = base(FC_OPT_ADAMW);
    hdrop(&h->f[0], "layers.0.weight");
    REFUSED(hset_write(h, "gap_first_row"), "elements [0, 3) of layers.0.weight param", "in no shard file");
    // a parameter in no file at all
    h = base(FC_OPT_ADAMW);
    hdrop(&h->f[0], "layers.1.bias");
    hdrop(&h->f[1], "layers.1.bias");
    REFUSED(hset_write(h, "gap_all"), "elements [0, 2) of layers.1.bias param", "in no shard file");
    base_done();
}

Test(dcp, saved_offsets_refused) {
    struct {
        const char *tensor, *offsets, *want;
    } cases[] = {
        {"layers.1.weight", "[1, 1]", "only dim-0 blocks"},             // a column offset
        {"state.layers.0.weight.exp_avg", "[1, 2]", "starts at column 2"},
        {"layers.0.weight", "[2, 0]", "rows [2, 3) are outside layers.0.weight's 2"},  // beyond the rows
        {"layers.0.bias", "[5]", "rows [5, 6) are outside"},
        {"layers.0.bias", "[9007199254740992]", "are outside"},
        {"layers.0.weight", "[-1, 0]", "saved_offsets[0] is not a non-negative integer"},
        {"layers.0.weight", "[0.5, 0]", "saved_offsets[0] is not a non-negative integer"},
        {"layers.0.weight", "[1e300, 0]", "saved_offsets[0] is not a non-negative integer"},
        {"layers.0.weight", "[1, \"0\"]", "saved_offsets[1] is not a non-negative integer"},
        {"layers.0.weight", "[1]", "is not a block of rows of layers.0.weight's shape"},  // too few offsets
        {"layers.0.bias", "[1, 0]", "is not a block of rows"},                           // too many
        {"layers.0.weight", "[1, 0, 0]", "is not a block of rows"},
        {"layers.0.weight", "[]", "is not a block of rows"},
        {"layers.0.weight", "{\"0\": 1}", "has no {\"saved_offsets\": [...]}"},  // not an array
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hset *h = base(FC_OPT_ADAMW);
        set_off(&h->f[1], cases[i].tensor, cases[i].offsets);
        char name[32];
        snprintf(name, sizeof name, "off%zu", i);
        REFUSED(hset_write(h, name), F2, cases[i].tensor, cases[i].want);
    }
    // the block's own shape against the parameter's
    hset *h = base(FC_OPT_ADAMW);
    hfind(&h->f[1], "layers.0.weight")->shape[1] = 2;  // [1, 2] of a [2, 3]
    REFUSED(hset_write(h, "cols"), F2, "layers.0.weight", "is not a block of rows");
    h = base(FC_OPT_ADAMW);
    ht *t = hfind(&h->f[1], "layers.0.weight");  // 1-D [3] for 2-D rows
    t->ndim = 1;
    t->shape[0] = 3;
    set_off(&h->f[1], "layers.0.weight", "[1]");
    REFUSED(hset_write(h, "ndim"), F2, "layers.0.weight", "is not a block of rows");
    base_done();
}

Test(dcp, metadata_refused) {
    hset *h = base(FC_OPT_ADAMW);
    h->f[1].version = "2.0";
    REFUSED(hset_write(h, "v2"), F2, "\"DCP_VERSION\" is 2.0, not \"1.0\"");
    h = base(FC_OPT_ADAMW);
    h->f[0].version = NULL;
    REFUSED(hset_write(h, "v_absent"), F1, "\"DCP_VERSION\" is absent");
    h = base(FC_OPT_ADAMW);
    h->f[0].version = "1";
    REFUSED(hset_write(h, "v1"), F1, "DCP_VERSION");
    h = base(FC_OPT_ADAMW);
    h->f[1].format = "np";
    REFUSED(hset_write(h, "fmt"), F2, "\"format\": \"pt\"");
    h = base(FC_OPT_ADAMW);
    h->f[1].format = NULL;
    REFUSED(hset_write(h, "fmt_absent"), F2, "\"format\": \"pt\"");
    h = base(FC_OPT_ADAMW);
    h->f[1].no_info = 1;
    REFUSED(hset_write(h, "no_info"), F2, "\"DCP_SHARDING_INFO\" is absent");
    const char *not_objects[] = {"not json", "[]", "\"layers.0.weight\"", "{\"layers.0.weight\": 1", "null",
                                 ("{\"layers.0.weight\": {\"saved_offsets\": [1, 0]}, \"layers.0.weight\": "
                                  "{\"saved_offsets\": [1, 0]}}")};
    for (size_t i = 0; i < sizeof not_objects / sizeof not_objects[0]; i++) {
        h = base(FC_OPT_ADAMW);
        h->f[1].info = not_objects[i];
        char name[32];
        snprintf(name, sizeof name, "info%zu", i);
        REFUSED(hset_write(h, name), F2, "\"DCP_SHARDING_INFO\" is not a JSON object");
    }
    // a whole object followed by more text: json.loads refuses it, and so must we
    h = base(FC_OPT_ADAMW);
    snprintf(h->f[1].extra, sizeof h->f[1].extra, "} trailing garbage {\"a\": 1");
    REFUSED(hset_write(h, "info_trailing"), F2, "\"DCP_SHARDING_INFO\" is not a JSON object");
    // an entry for a tensor the file does not hold
    h = base(FC_OPT_ADAMW);
    snprintf(h->f[1].extra, sizeof h->f[1].extra, ", \"layers.1.bias.extra\": {\"saved_offsets\": [1]}");
    REFUSED(hset_write(h, "info_extra"), F2, "places 'layers.1.bias.extra', which the file does not hold");
    h = base(FC_OPT_ADAMW);  // a tensor of the other file
    snprintf(h->f[1].extra, sizeof h->f[1].extra, ", \"state.layers.0.bias.step\": {\"saved_offsets\": []}");
    REFUSED(hset_write(h, "info_other_file"), F2, "'state.layers.0.bias.step', which the file does not hold");
    // a tensor without an entry, or with an entry that is not {"saved_offsets": [...]}
    const char *bad_entries[] = {"", "[1, 0]", "{}", "{\"saved_offsets\": [1, 0], \"x\": 1}",
                                 "{\"offsets\": [1, 0]}"};
    for (size_t i = 0; i < sizeof bad_entries / sizeof bad_entries[0]; i++) {
        h = base(FC_OPT_ADAMW);
        snprintf(hfind(&h->f[1], "layers.1.weight")->off, sizeof h->f[1].t[0].off, "%s", bad_entries[i]);
        char name[32];
        snprintf(name, sizeof name, "entry%zu", i);
        REFUSED(hset_write(h, name), F2,
                "tensor 'layers.1.weight' has no {\"saved_offsets\": [...]} in DCP_SHARDING_INFO");
    }
    base_done();
}

Test(dcp, tensors_refused) {
    struct {
        const char *name;
        int ndim;
        const char *offsets, *want;
    } unknown[] = {
        {"layers.2.weight", 2, "[0, 0]", "tensor 'layers.2.weight' is neither a parameter of model mlp-micro"},
        {"lm_head.weight", 2, "[0, 0]", "is neither a parameter"},
        {"state.layers.9.weight.exp_avg", 2, "[0, 0]", "is neither a parameter"},
        {"state.layers.0.weight", 2, "[0, 0]", "is neither a parameter"},
        {"state..exp_avg", 2, "[0, 0]", "is neither a parameter"},
        {"exp_avg.layers.0.weight", 2, "[0, 0]", "is neither a parameter"},  // FULL's name
        {"unit0.param", 1, "[0]", "is neither a parameter"},                 // FSDP1's
        {"state.layers.0.weight.momentum_buffer", 2, "[0, 0]", "is not a state the adamw optimizer keeps"},
        {"state.layers.0.weight.param", 2, "[0, 0]", "is not a state the adamw optimizer keeps"},
    };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        hset *h = base(FC_OPT_ADAMW);
        hadd(&h->f[1], unknown[i].name, unknown[i].ndim, 1, unknown[i].ndim == 2 ? 3 : 1, unknown[i].offsets);
        char name[32];
        snprintf(name, sizeof name, "unknown%zu", i);
        REFUSED(hset_write(h, name), F2, unknown[i].want);
    }
    // not F32: a parameter block, a state block, a step
    struct {
        int file;
        const char *tensor;
        fc_dtype dtype;
        const char *want;
    } dtypes[] = {
        {1, "layers.0.weight", FC_DT_F16, "tensor 'layers.0.weight' is F16, not F32"},
        {0, "state.layers.1.bias.exp_avg_sq", FC_DT_BF16, "is BF16, not F32"},
        {1, "layers.1.bias", FC_DT_F64, "is F64, not F32"},
        {0, "state.layers.0.bias.step", FC_DT_I64, "tensor 'state.layers.0.bias.step' is I64, not F32"},
    };
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        hset *h = base(FC_OPT_ADAMW);
        hfind(&h->f[dtypes[i].file], dtypes[i].tensor)->dtype = dtypes[i].dtype;
        char name[32];
        snprintf(name, sizeof name, "dtype%zu", i);
        REFUSED(hset_write(h, name), dtypes[i].file ? F2 : F1, dtypes[i].want);
    }
    base_done();
}

Test(dcp, steps_refused) {
    // AdamW: every parameter's step once, equal to the manifest's
    hset *h = base(FC_OPT_ADAMW);
    hdrop(&h->f[0], "state.layers.1.bias.step");
    REFUSED(hset_write(h, "step_missing"), "no shard file holds state.layers.1.bias.step");
    h = base(FC_OPT_ADAMW);
    hadd(&h->f[1], "state.layers.0.weight.step", 0, 0, 0, "[]")->data[0] = 2.0f;
    REFUSED(hset_write(h, "step_twice"), "tensor 'state.layers.0.weight.step' is in two shard files");
    h = base(FC_OPT_ADAMW);
    hfind(&h->f[0], "state.layers.0.bias.step")->data[0] = 3.0f;
    REFUSED(hset_write(h, "step_value"), F1, "'state.layers.0.bias.step' is 3, the manifest's step is 2");
    h = base(FC_OPT_ADAMW);
    hfind(&h->f[0], "state.layers.0.bias.step")->data[0] = 2.5f;
    REFUSED(hset_write(h, "step_fraction"), F1, "is 2.5, the manifest's step is 2");
    h = base(FC_OPT_ADAMW);
    ht *t = hfind(&h->f[0], "state.layers.1.weight.step");
    t->ndim = 1;
    t->shape[0] = 1;
    REFUSED(hset_write(h, "step_1d"), F1, "'state.layers.1.weight.step' must be a scalar with saved_offsets []");
    h = base(FC_OPT_ADAMW);
    set_off(&h->f[0], "state.layers.1.weight.step", "[0]");
    REFUSED(hset_write(h, "step_offsets"), F1, "must be a scalar with saved_offsets []");
    // all steps in the second file is as good as in the first
    h = base(FC_OPT_ADAMW);
    for (int p = 0; p < 4; p++) {
        char name[160];
        snprintf(name, sizeof name, "state.%s.step", h->x.m.params[p].name);
        hdrop(&h->f[0], name);
        hadd(&h->f[1], name, 0, 0, 0, "[]")->data[0] = 2.0f;
    }
    expect_hset_ok(h, "steps_in_file_2");
    // SGD keeps no step
    h = base(FC_OPT_SGD);
    hadd(&h->f[0], "state.layers.0.weight.step", 0, 0, 0, "[]")->data[0] = 2.0f;
    REFUSED(hset_write(h, "sgd_step"), F1,
            "tensor 'state.layers.0.weight.step' is not a state the sgd optimizer keeps");
    h = base(FC_OPT_SGD);
    hadd(&h->f[1], "state.layers.0.weight.exp_avg", 2, 1, 3, "[1, 0]");
    REFUSED(hset_write(h, "sgd_exp_avg"), F2, "is not a state the sgd optimizer keeps");
    base_done();
}

Test(dcp, file_names_in_the_manifest_refused) {
    // shard 9 of a 2-rank world
    hset *h = base(FC_OPT_ADAMW);
    snprintf(h->f[1].name, sizeof h->f[1].name, "shard-00009-model-00001-of-00001.safetensors");
    REFUSED(hset_write(h, "shard9"), "fsdpcheck.json", "shard-00009-model-00001-of-00001.safetensors",
            "shard 9 is outside the world of 2 ranks");
    // shard 3 of 2 as well; shard 2 of 2 (the base) is fine
    h = base(FC_OPT_ADAMW);
    snprintf(h->f[1].name, sizeof h->f[1].name, "shard-00003-model-00001-of-00001.safetensors");
    REFUSED(hset_write(h, "shard3"), "shard 3 is outside the world of 2 ranks");
    // the same files saved from a world of 9 are fine (shards 1 and 9)
    h = base(FC_OPT_ADAMW);
    snprintf(h->f[1].name, sizeof h->f[1].name, "shard-00009-model-00001-of-00001.safetensors");
    h->W = 9;
    expect_hset_ok(h, "shard9_of_9");
    // FSDP1's shard file, or a FULL file, in a DCP checkpoint
    const char *others[] = {"shard-00001.safetensors", "model.safetensors",
                            "shard-00000-model-00001-of-00001.safetensors",
                            "shard-00002-model-00002-of-00001.safetensors"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        h = base(FC_OPT_ADAMW);
        snprintf(h->f[1].name, sizeof h->f[1].name, "%s", others[i]);
        char name[32];
        snprintf(name, sizeof name, "other%zu", i);
        REFUSED(hset_write(h, name), others[i], "does not belong in a dcp checkpoint");
    }
    // no DCP file at all
    h = base(FC_OPT_ADAMW);
    h->n_files = 0;
    REFUSED(hset_write(h, "none"), "lists no shard-SSSSS-model-IIIII-of-NNNNN.safetensors");
    base_done();
}

// ----------------------------------------------------------------------------
// 3. the file name parser

Test(dcp, file_name_parser) {
    struct {
        const char *name;
        long want;
    } cases[] = {
        {"shard-00001-model-00001-of-00001.safetensors", 1},
        {"shard-00012-model-00001-of-00001.safetensors", 12},
        {"shard-00003-model-00002-of-00005.safetensors", 3},
        {"shard-1-model-1-of-1.safetensors", 1},
        {"shard-100000-model-00001-of-00001.safetensors", 100000},
        {"shard-999999999-model-1-of-999999999.safetensors", 999999999},
        {"shard-00001-model-00007-of-00007.safetensors", 1},
        // refused
        {"shard-0-model-1-of-1.safetensors", -1},
        {"shard-00000-model-00001-of-00001.safetensors", -1},
        {"shard-00001-model-00000-of-00001.safetensors", -1},
        {"shard-00001-model-00002-of-00001.safetensors", -1},  // -of- smaller than the index
        {"shard-00001-model-00001-of-00000.safetensors", -1},
        {"shard-00001-model-00001-of-00001.safetensors.tmp.42", -1},  // trailing junk
        {"shard-00001-model-00001-of-00001.safetensorsx", -1},
        {"shard-00001-model-00001-of-00001x.safetensors", -1},
        {"shard-00001-model-00001-of-00001.", -1},
        {"shard-00001-model-00001-of-00001", -1},  // missing parts
        {"shard-00001-model-00001-of-.safetensors", -1},
        {"shard-00001-model-00001.safetensors", -1},
        {"shard-00001-model--of-00001.safetensors", -1},
        {"shard-00001.safetensors", -1},  // FSDP1's
        {"shard--model-00001-of-00001.safetensors", -1},
        {"shard-model-00001-of-00001.safetensors", -1},
        {"shard-00001-optim-00001-of-00001.safetensors", -1},
        {"shard-00001-model-00001-of-00001.SAFETENSORS", -1},
        {"Shard-00001-model-00001-of-00001.safetensors", -1},
        {"xshard-00001-model-00001-of-00001.safetensors", -1},
        {"shard-+0001-model-00001-of-00001.safetensors", -1},
        {"shard- 0001-model-00001-of-00001.safetensors", -1},
        {"shard-1234567890-model-00001-of-00001.safetensors", -1},  // ten digits
        {"shard-00001-model-1234567890-of-1234567890.safetensors", -1},
        {"model.safetensors", -1},
        {"shard-", -1},
        {"", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(fc_ckpt_dcp_index(cases[i].name), cases[i].want, "'%s': %ld, want %ld", cases[i].name,
                     fc_ckpt_dcp_index(cases[i].name), cases[i].want);
    // the writer's names parse back to rank + 1
    for (int r = 0; r < 100000; r += 997) {
        char name[64];
        fc_ckpt_dcp_name(r, name, sizeof name);
        cr_expect_eq(fc_ckpt_dcp_index(name), r + 1, "%s", name);
    }
}

// ----------------------------------------------------------------------------
// 4. `fsdpcheck ckpt convert --to dcp` (the binary, no MPI)

Test(dcp, convert_writes_what_the_writer_writes) {
    // crafted W=3 -> convert --to dcp at W=5 -> the writer's own W=5, byte
    // for byte; and -> full: the crafted values in model.safetensors
    ctx x;
    ctx_init(&x, "gpt2-tiny", FC_OPT_ADAMW, 0.9, 5);
    char a[1024], b[1024], c5[1024], full[1024];
    snprintf(a, sizeof a, "%s", tmp_path("a"));
    snprintf(b, sizeof b, "%s", tmp_path("b"));
    snprintf(c5, sizeof c5, "%s", tmp_path("c5"));
    snprintf(full, sizeof full, "%s", tmp_path("full"));
    write_dcp(&x, a, 3, 0, 0);
    write_dcp(&x, c5, 5, 1, 0);
    result r;
    run_in(NULL, ARGS("ckpt", "convert", a, b, "--to", "dcp", "--world-size", "5"), &r);
    cr_assert_eq(r.code, 0, "%s: exit %d: %s", r.cmd, r.code, r.err);
    result_free(&r);
    expect_dcp_listing(b, 5);
    const char *same[] = {"config.json", FC_CKPT_MANIFEST, F1, F2, "shard-00003-model-00001-of-00001.safetensors",
                          "shard-00004-model-00001-of-00001.safetensors",
                          "shard-00005-model-00001-of-00001.safetensors"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char p[1200], q[1200];
        snprintf(p, sizeof p, "%s/%s", b, same[i]);
        snprintf(q, sizeof q, "%s/%s", c5, same[i]);
        cr_expect(same_bytes(p, q), "%s differs between convert and the writer", same[i]);
    }
    run_in(NULL, ARGS("ckpt", "verify", b), &r);
    cr_expect_eq(r.code, 0, "%s", r.err);
    result_free(&r);
    run_in(NULL, ARGS("ckpt", "convert", a, full, "--to", "full"), &r);
    cr_assert_eq(r.code, 0, "%s: exit %d: %s", r.cmd, r.code, r.err);
    result_free(&r);
    fc_st_file f;
    fc_error e;
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", full);
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    for (int p = 0; p < x.m.n_params; p++) {
        const fc_st_tensor *t = fc_st_find(&f, x.m.params[p].name);
        cr_assert_not_null(t);
        float *v = malloc(t->numel * sizeof(float));
        cr_assert_not_null(v);
        cr_assert_eq(fc_st_read_f32(&f, t, 0, t->numel, v, &e), 0, "%s", e.msg);
        for (size_t i = 0; i < t->numel; i++)
            if (v[i] != val(p, 0, i)) {
                cr_expect_fail("%s element %zu: %.1f, want %.1f", x.m.params[p].name, i, (double)v[i],
                               (double)val(p, 0, i));
                break;
            }
        free(v);
    }
    fc_st_close(&f);
    ctx_free(&x);
}
