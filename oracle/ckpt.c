// oracle/ckpt.c — `fsdpcheck ckpt inspect|verify|convert`: checkpoints
// (docs/contract.md §6) without training. One process, no MPI: everything goes through
// core/checkpoint.h, the same reader and writer the implementations use.
//
//   inspect DIR    the manifest and every file's tensors (structure checked,
//                  checksums not: that is what verify is for)
//   verify DIR     everything, SHA-256 included: exit 0 valid, 2 refused
//   convert SRC DST --to full|sharded|dcp [--world-size W]
//                  sharded writes the W-way flat layout, dcp FSDP2's W-way
//                  rows as DCP's files (one file per rank, W = the source's
//                  world size by default), reading one chunk at a time; full
//                  assembles the model (and the optimizer state) in memory
//                  and writes it. Any of the three converts to any other.
#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "flags.h"
#include "layout.h"

static void usage(FILE *f) {
    fputs("usage: fsdpcheck ckpt inspect DIR\n"
          "       fsdpcheck ckpt verify DIR\n"
          "       fsdpcheck ckpt convert SRC DST --to full|sharded|dcp [--world-size W]\n"
          "  inspect   print the manifest (format, step, state dict, where it was saved from, model,\n"
          "            optimizer), every file with its size and SHA-256, and every tensor\n"
          "  verify    check the manifest, every file's size and SHA-256, every header, and every\n"
          "            parameter and optimizer state with its shape: exit 0 valid, 2 refused\n"
          "  convert   rewrite a checkpoint as a FULL_STATE_DICT, a SHARDED_STATE_DICT in FSDP1's W-way\n"
          "            flat layout, or FSDP2's in DCP's Hugging Face safetensors with W-way rows\n"
          "            (torch's HuggingFaceStorageReader loads it; W defaults to the source's world size)\n",
          f);
}

static fc_ckpt *open_or_die(const char *dir, int check_hashes) {
    fc_ckpt *c;
    fc_error e;
    if (fc_ckpt_open(dir, check_hashes, &c, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    return c;
}

static uint64_t total_bytes(const fc_ckpt_manifest *m) {
    uint64_t n = 0;
    for (int i = 0; i < m->n_files; i++) n += m->files[i].bytes;
    return n;
}

// "[97, 16]"
static void shape_text(const fc_st_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

// ---------------------------------------------------------------------------
// inspect

// One tensor's line; a shard's layout (which elements of which unit it
// holds) or a DCP block's rows (which rows of the full tensor).
static void print_tensor(const fc_st_tensor *t, const char *layout, const cJSON *dcp) {
    char shape[96];
    shape_text(t, shape, sizeof shape);
    printf("    %-48s %-4s %-14s", t->name, fc_dtype_name(t->dtype), shape);
    cJSON *j = layout ? cJSON_Parse(layout) : NULL;
    const cJSON *off = dcp ? cJSON_GetObjectItem(cJSON_GetObjectItem(dcp, t->name), "saved_offsets") : NULL;
    if (cJSON_GetArraySize(off) > 0 && t->ndim > 0)
        printf(" rows [%.0f, %.0f)", cJSON_GetArrayItem(off, 0)->valuedouble,
               cJSON_GetArrayItem(off, 0)->valuedouble + (double)t->shape[0]);
    if (j) {
        const cJSON *u = cJSON_GetObjectItem(j, "unit"), *un = cJSON_GetObjectItem(j, "unit_name"),
                    *f = cJSON_GetObjectItem(j, "first"), *n = cJSON_GetObjectItem(j, "count"),
                    *N = cJSON_GetObjectItem(j, "unit_numel");
        printf(" unit %d (%s) elements [%.0f, %.0f) of %.0f", u->valueint,
               un->valuestring[0] ? un->valuestring : "root", f->valuedouble, f->valuedouble + n->valuedouble,
               N->valuedouble);
        cJSON_Delete(j);
    }
    printf("\n");
}

static void print_files(fc_ckpt *c, const fc_ckpt_manifest *m) {
    int w = 26;
    for (int i = 0; i < m->n_files; i++)
        if ((int)strlen(m->files[i].name) > w) w = (int)strlen(m->files[i].name);
    for (int i = 0; i < m->n_files; i++)
        printf("    %-*s %14" PRIu64 " bytes  sha256 %s\n", w, m->files[i].name, m->files[i].bytes, m->files[i].sha256);
    for (int i = 0; i < m->n_files; i++) {
        const fc_st_file *st = fc_ckpt_st(c, m->files[i].name);
        if (!st) continue;
        printf("  tensors of %s (%d)\n", m->files[i].name, st->n_tensors);
        const char *sharding = m->kind == FC_STATE_DICT_DCP ? fc_st_meta(st, "DCP_SHARDING_INFO") : NULL;
        cJSON *d = sharding ? cJSON_Parse(sharding) : NULL;
        for (int k = 0; k < st->n_tensors; k++) {
            const fc_st_tensor *t = &st->tensors[k];
            print_tensor(t, m->kind == FC_STATE_DICT_SHARDED ? fc_st_meta(st, t->name) : NULL, d);
        }
        cJSON_Delete(d);
    }
}

static int cmd_inspect(const char *dir) {
    fc_ckpt *c = open_or_die(dir, 0);
    const fc_ckpt_manifest *m = fc_ckpt_manifest_of(c);
    const fc_model *model = fc_ckpt_model(c);
    const fc_run_config *cfg = &m->cfg;
    printf("checkpoint %s\n", dir);
    printf("  format      %s version %d\n", FC_CKPT_FORMAT, m->version);
    printf("  state dict  %s\n", fc_state_dict_name(m->kind));
    printf("  step        %ld (optimizer steps taken; the next step and data position)\n", m->step);
    printf("  saved from  W=%d, strategy %s\n", m->world_size, fc_strategy_name(m->strategy));
    char desc[300];
    fc_model_config_describe(&cfg->model, desc, sizeof desc);
    printf("  model       %s", desc);
    printf(" (%zu parameters in %d tensors, %d units)\n", model->numel, model->n_params, model->n_units);
    printf("  optimizer   %s, lr %g, weight decay %g; state:", fc_opt_name(cfg->optim.kind), cfg->optim.lr,
           cfg->optim.weight_decay);
    for (int s = 0; s < m->n_state; s++) printf(" %s", m->state_names[s]);
    printf("%s\n", m->n_state ? "" : " none");
    printf("  run         seed %llu, global batch %d, seq len %d, grad accum %d\n", (unsigned long long)cfg->seed,
           cfg->global_batch, cfg->seq_len, cfg->grad_accum);
    printf("  files       %d, %" PRIu64 " bytes\n", m->n_files, total_bytes(m));
    print_files(c, m);
    printf("  checksums not verified here: run 'fsdpcheck ckpt verify %s'\n", dir);
    fc_ckpt_close(c);
    return FC_EXIT_PASS;
}

// ---------------------------------------------------------------------------
// verify

static int cmd_verify(const char *dir) {
    fc_ckpt *c = open_or_die(dir, 1);
    const fc_ckpt_manifest *m = fc_ckpt_manifest_of(c);
    printf("%s: valid fsdpcheck checkpoint: %s state dict, step %ld, model %s, %d files, %" PRIu64
           " bytes, SHA-256 verified\n",
           dir, fc_state_dict_name(m->kind), m->step, m->cfg.model.name, m->n_files, total_bytes(m));
    fc_ckpt_close(c);
    return FC_EXIT_PASS;
}

// ---------------------------------------------------------------------------
// convert

// Reads the whole of tensor t (every parameter) into dst [numel].
static int read_all(fc_ckpt *c, int t, float *dst, fc_error *e) {
    const fc_model *m = fc_ckpt_model(c);
    for (int p = 0; p < m->n_params; p++)
        if (fc_ckpt_read(c, p, t, 0, m->params[p].numel, dst + m->params[p].offset, e)) return -1;
    return 0;
}

static int to_full(fc_ckpt *c, const char *dst, fc_error *e) {
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    const fc_model *m = fc_ckpt_model(c);
    float *params = mallocCheck(m->numel * sizeof(float)), *state[2] = {NULL, NULL};
    int rc = read_all(c, 0, params, e);
    for (int s = 0; s < man->n_state; s++) {
        state[s] = mallocCheck(m->numel * sizeof(float));
        if (!rc) rc = read_all(c, 1 + s, state[s], e);
    }
    fc_ckpt_info info = {&man->cfg, m, man->step, man->world_size, man->strategy};
    if (!rc) rc = fc_ckpt_save_full(dst, &info, params, (const float *const *)state, e);
    free(params);
    free(state[0]);
    free(state[1]);
    return rc;
}

// The W-way layout, one rank's file at a time: memory O(model / W).
static int to_sharded(fc_ckpt *c, const char *dst, int W, fc_error *e) {
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    const fc_model *m = fc_ckpt_model(c);
    int nt = 1 + man->n_state;
    // this layout is exactly what full_shard at W writes
    fc_ckpt_info info = {&man->cfg, m, man->step, W, FC_STRATEGY_FULL_SHARD};
    fc_ckpt_file *files = mallocCheck(((size_t)W + 1) * sizeof *files);
    fc_ckpt_chunk_data *chunks = callocCheck((size_t)m->n_units, sizeof *chunks);
    float **bufs = callocCheck((size_t)(m->n_units * nt), sizeof *bufs);
    int rc = fc_ckpt_prepare_dir(dst, e) || fc_ckpt_write_config(dst, &info, &files[0], e) ? -1 : 0;
    for (int r = 0; !rc && r < W; r++) {
        for (int u = 0; u < m->n_units; u++) {
            size_t first, count;
            fc_flat_chunk(m->units[u].numel, W, r, &first, &count);
            chunks[u] = (fc_ckpt_chunk_data){u, first, count, NULL, {NULL, NULL}};
            for (int t = 0; t < nt; t++) {
                float *b = mallocCheck((count ? count : 1) * sizeof(float));
                bufs[u * nt + t] = b;
                if (!rc && count) rc = fc_ckpt_read_unit(c, u, t, first, count, b, e);
                if (t == 0) chunks[u].param = b;
                else chunks[u].state[t - 1] = b;
            }
        }
        if (!rc) rc = fc_ckpt_write_shard(dst, r, &info, chunks, m->n_units, &files[1 + r], e);
        for (int k = 0; k < m->n_units * nt; k++) free(bufs[k]), bufs[k] = NULL;
    }
    if (!rc) rc = fc_ckpt_write_manifest(dst, &info, FC_STATE_DICT_SHARDED, files, W + 1, e);
    free(bufs);
    free(chunks);
    free(files);
    return rc;
}

// FSDP2's W-way rows as DCP's files, one rank's file at a time.
static int to_dcp(fc_ckpt *c, const char *dst, int W, fc_error *e) {
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    const fc_model *m = fc_ckpt_model(c);
    const fc_layout_ops *lay = fc_layout_of(FC_LAYOUT_PER_PARAM);
    int nt = 1 + man->n_state;
    fc_ckpt_info info = {&man->cfg, m, man->step, W, FC_STRATEGY_FULL_SHARD};
    fc_ckpt_file *files = mallocCheck(((size_t)W + 1) * sizeof *files);
    fc_ckpt_rows *blocks = callocCheck((size_t)m->n_params, sizeof *blocks);
    fc_piece *pc = callocCheck((size_t)m->n_params + 1, sizeof *pc);
    float **bufs = callocCheck((size_t)(m->n_params * nt), sizeof *bufs);
    int rc = fc_ckpt_prepare_dir(dst, e) || fc_ckpt_write_config(dst, &info, &files[0], e) ? -1 : 0;
    for (int r = 0; !rc && r < W; r++) {
        int n = 0;
        for (int u = 0; u < m->n_units && !rc; u++) {
            int np = lay->pieces(m, u, W, r, pc);
            for (int k = 0; k < np && !rc; k++, n++) {
                blocks[n] = fc_ckpt_rows_of_piece(m, u, pc[k].unit_off, pc[k].count);
                for (int t = 0; t < nt; t++) {
                    float *b = bufs[n * nt + t] = mallocCheck(pc[k].count * sizeof(float));
                    if (!rc) rc = fc_ckpt_read_unit(c, u, t, pc[k].unit_off, pc[k].count, b, e);
                    if (t == 0) blocks[n].data = b;
                    else blocks[n].state[t - 1] = b;
                }
            }
        }
        if (!rc) rc = fc_ckpt_write_dcp(dst, r, &info, blocks, n, r == 0, 0, &files[1 + r], e);
        for (int k = 0; k < m->n_params * nt; k++) free(bufs[k]), bufs[k] = NULL;
    }
    if (!rc) rc = fc_ckpt_write_manifest(dst, &info, FC_STATE_DICT_DCP, files, W + 1, e);
    free(bufs);
    free(pc);
    free(blocks);
    free(files);
    return rc;
}

static int cmd_convert(int argc, char **argv) {
    enum { TO, WORLD_SIZE };
    static const fc_flag flags[] = {[TO] = {"--to", FC_FLAG_VALUE}, [WORLD_SIZE] = {"--world-size", FC_FLAG_VALUE}};
    static const fc_flag_words words = {"ckpt convert: ", " (see fsdpcheck ckpt --help)", "ckpt convert: ", ""};
    const char *pos[2] = {NULL, NULL}, *to = NULL;
    int npos = 0, W = 0;
    fc_flags it = fc_flags_begin(argc, argv, flags, FC_FLAGS_COUNT(flags), &words, 0);
    fc_error e;
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        if (id == TO) {
            to = it.value;
        } else if (id == WORLD_SIZE) {
            if (fc_flag_int(it.name, it.value, 1, 65536, &W, &e))
                fc_die(FC_EXIT_USAGE, "ckpt convert: --world-size '%s' is not an integer in 1..65536", it.value);
        } else if (npos < 2) {
            pos[npos++] = it.arg;
        } else {
            fc_die(FC_EXIT_USAGE, "ckpt convert: unexpected argument '%s' (SRC DST --to full|sharded|dcp)", it.arg);
        }
    }
    fc_state_dict kind;
    if (npos != 2) fc_die(FC_EXIT_USAGE, "ckpt convert: needs SRC and DST directories");
    if (!to || fc_state_dict_parse(to, &kind))
        fc_die(FC_EXIT_USAGE, "ckpt convert: --to must be full, sharded or dcp");
    if (W && kind == FC_STATE_DICT_FULL)
        fc_die(FC_EXIT_USAGE, "ckpt convert: --world-size applies to --to sharded and --to dcp");
    // writing DST removes its old checkpoint first: DST must not be SRC
    struct stat ss, sd;
    if (stat(pos[0], &ss) == 0 && stat(pos[1], &sd) == 0 && ss.st_dev == sd.st_dev && ss.st_ino == sd.st_ino)
        fc_die(FC_EXIT_USAGE, "ckpt convert: SRC and DST are the same directory (%s)", pos[1]);
    fc_ckpt *c = open_or_die(pos[0], 1);
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    if (!W) W = man->world_size;
    int rc = kind == FC_STATE_DICT_FULL      ? to_full(c, pos[1], &e)
             : kind == FC_STATE_DICT_SHARDED ? to_sharded(c, pos[1], W, &e)
                                             : to_dcp(c, pos[1], W, &e);
    if (rc) {
        fc_error ignore;
        (void)fc_ckpt_prepare_dir(pos[1], &ignore);  // leave no partial checkpoint behind
        fc_ckpt_close(c);
        fc_die(FC_EXIT_USAGE, "%s", e.msg);
    }
    if (kind == FC_STATE_DICT_FULL)
        printf("converted %s (%s, step %ld) to %s (full)\n", pos[0], fc_state_dict_name(man->kind), man->step, pos[1]);
    else
        printf("converted %s (%s, step %ld) to %s (%s, %d-way %s)\n", pos[0], fc_state_dict_name(man->kind),
               man->step, pos[1], fc_state_dict_name(kind), W, kind == FC_STATE_DICT_DCP ? "rows" : "flat layout");
    fc_ckpt_close(c);
    return FC_EXIT_PASS;
}

int fc_cmd_ckpt(int argc, char **argv) {
    if (argc < 1) fc_die(FC_EXIT_USAGE, "ckpt: needs inspect, verify or convert (see fsdpcheck ckpt --help)");
    const char *sub = argv[0];
    if (!strcmp(sub, "--help") || !strcmp(sub, "help")) {
        usage(stdout);
        return FC_EXIT_PASS;
    }
    if (!strcmp(sub, "inspect") || !strcmp(sub, "verify")) {
        if (argc != 2) fc_die(FC_EXIT_USAGE, "ckpt %s: needs exactly one checkpoint directory", sub);
        if (!strncmp(argv[1], "--", 2)) fc_die(FC_EXIT_USAGE, "ckpt %s: unknown flag %s", sub, argv[1]);
        return sub[0] == 'i' ? cmd_inspect(argv[1]) : cmd_verify(argv[1]);
    }
    if (!strcmp(sub, "convert")) return cmd_convert(argc - 1, argv + 1);
    fc_die(FC_EXIT_USAGE, "ckpt: unknown subcommand '%s' (inspect, verify, convert)", sub);
}
