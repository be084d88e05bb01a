// tests/ports/hwlike/hwlike.c — the hardware-like port's entry point, its
// arithmetic context and its collectives' sums.
//
// The port is the reference engine compiled again (CMakeLists.txt) with this
// directory's kernels and arith_seams.h; its operations table is the
// reference's, wrapped so that each instance computes with its own context
// (hw), and it claims what its arithmetic guarantees (core/impl.h): never
// layout invariance, determinism unless the atomics knob is on.
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arith_seams.h"
#include "check.h"
#include "hwlike.h"
#include "impl.h"
#include "mpicheck.h"
#include "round.h"

// The engine inside: the reference's table, or its fault catalogue's (HW_INNER, CMakeLists.txt).
const fc_impl_ops *HW_INNER(void);

hw_ctx hw;

const char *const hw_knob_names[HW_K_COUNT] = {"matmul", "fma",       "compute16", "ring",   "tree",
                                               "avg",    "attention", "norms",     "atomics"};

uint64_t hw_mix(uint64_t a, uint64_t b) {
    uint64_t z = a ^ (b << 29 | b >> 35) ^ 0x9e3779b97f4a7c15ull * (b + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float hw_r16(float x) {
    if (!hw_on(HW_K_COMPUTE16) || hw.compute == FC_PREC_FP32) return x;
    return fc_round(hw.compute, x);
}

void hw_r16n(float *x, size_t n) {
    if (!hw_on(HW_K_COMPUTE16) || hw.compute == FC_PREC_FP32) return;
    for (size_t i = 0; i < n; i++) x[i] = fc_round(hw.compute, x[i]);
}

unsigned hw_align_class(const void *p) { return hw.flat_offsets ? (unsigned)((uintptr_t)p & 255u) : 0u; }

void hw_atomic_order(size_t *perm, size_t n, uint64_t salt) {
    static uint64_t calls;  // a fresh order per call, as a GPU's scheduling gives
    uint64_t s = hw_mix(hw_mix(hw.nonce, salt), ++calls);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n; i > 1; i--) {  // Fisher-Yates
        s = hw_mix(s, i);
        size_t j = (size_t)(s % i), t = perm[i - 1];
        perm[i - 1] = perm[j], perm[j] = t;
    }
}

void *hw_calloc(size_t n) {
    void *p = NULL;
    size_t bytes = (n + 255u) / 256u * 256u;
    if (posix_memalign(&p, 256, bytes)) {
        fprintf(stderr, "hwlike: %s:%d: posix_memalign of %zu bytes failed\n", __FILE__, __LINE__, bytes);
        exit(EXIT_FAILURE);
    }
    return memset(p, 0, bytes);
}

// fp16 activation gradients underflow below 6.1e-5 without a loss scale, so
// fp16 training scales its loss (torch's GradScaler); a static 2^10 keeps the
// tiny models' gradients inside fp16's range. bf16 has fp32's range: none.
float hw_loss_scale(void) { return hw_on(HW_K_COMPUTE16) && hw.compute == FC_PREC_FP16 ? 1024.0f : 1.0f; }

void hw_scale(float *grad, size_t n, float s) {
    if (s == 1.0f) return;
    for (size_t i = 0; i < n; i++) grad[i] *= s;
}

float hw_div(float x, float d) { return hw_on(HW_K_AVG) ? x * (1.0f / d) : x / d; }

// Pairwise (tree) sum of the G chunks' element i over ranks [lo, hi).
static float tree_sum(const struct fc_fsdp *f, const void *recv, size_t S, size_t i, int lo, int hi, fc_prec rd,
                      hw_round_fn rnd) {
    if (hi - lo == 1) return fc_prec_load(rd, recv, (size_t)lo * S + i);
    int mid = lo + (hi - lo + 1) / 2;
    return rnd(f, rd, tree_sum(f, recv, S, i, lo, mid, rd, rnd) + tree_sum(f, recv, S, i, mid, hi, rd, rnd));
}

// NCCL picks its tree algorithm for small all-reduces and its ring for large
// ones; the switch is a size, here a fixed 64 KiB of the whole message.
#define HW_TREE_MAX_BYTES (64u << 10)

int hw_sum_chunks(const struct fc_fsdp *f, float *acc, const void *recv, size_t S, int G, fc_prec rd,
                  MPI_Comm comm, int allreduce, hw_round_fn rnd) {
    int tree = allreduce && hw_on(HW_K_TREE) && S * (size_t)G * fc_prec_size(rd) <= HW_TREE_MAX_BYTES;
    if (G < 2 || (!tree && !hw_on(HW_K_RING))) return 0;
    if (tree) {
        for (size_t i = 0; i < S; i++) acc[i] = tree_sum(f, recv, S, i, 0, G, rd, rnd);
        return 1;
    }
    // ring: this rank's block travels from the next rank round to itself
    int me;
    mpiCheck(MPI_Comm_rank(comm, &me));
    int first = (me + 1) % G;
    for (size_t i = 0; i < S; i++) acc[i] = fc_prec_load(rd, recv, (size_t)first * S + i);
    for (int k = 2; k <= G; k++) {
        size_t j = (size_t)((me + k) % G);
        for (size_t i = 0; i < S; i++) acc[i] = rnd(f, rd, acc[i] + fc_prec_load(rd, recv, j * S + i));
    }
    return 1;
}

// ---------------------------------------------------------------------------
// knobs from the environment

int hw_knobs_parse(const char *s, unsigned *knobs, char *why, size_t cap) {
    if (!s || !*s || strcmp(s, "default") == 0) return *knobs = HW_K_DEFAULT, 0;
    if (strcmp(s, "all") == 0) return *knobs = HW_K_ALL, 0;
    if (strcmp(s, "none") == 0) return *knobs = 0, 0;
    *knobs = 0;
    for (const char *p = s; *p;) {
        size_t n = strcspn(p, ",");
        int k = 0;
        while (k < HW_K_COUNT && !(strlen(hw_knob_names[k]) == n && strncmp(p, hw_knob_names[k], n) == 0)) k++;
        if (k == HW_K_COUNT) {
            snprintf(why, cap, "FSDPCHECK_HWLIKE: unknown knob '%.*s' (knobs: matmul, fma, compute16, ring, tree, "
                               "avg, attention, norms, atomics; or default, all, none)", (int)n, p);
            return -1;
        }
        *knobs |= 1u << k;
        p += n + (p[n] == ',');
    }
    return 0;
}

// What the environment asked for, read once when the library is loaded.
static struct {
    unsigned knobs;
    uint64_t seed;
    char bad[256];    // non-empty: the environment is bad input, and every create says so
    char name[160];   // the table's name: "hwlike[knob,...]"
} env;

static void env_read(void) {
    if (hw_knobs_parse(getenv("FSDPCHECK_HWLIKE"), &env.knobs, env.bad, sizeof env.bad)) return;
    const char *s = getenv("FSDPCHECK_HWLIKE_SEED");
    char *end = NULL;
    if (s && *s) {
        env.seed = strtoull(s, &end, 10);
        if (*end || !isdigit((unsigned char)*s))
            snprintf(env.bad, sizeof env.bad, "FSDPCHECK_HWLIKE_SEED: '%s' is not a non-negative integer", s);
    }
}

// ---------------------------------------------------------------------------
// the operations table: the engine's, each call under its instance's context

typedef struct {
    fc_impl *inner;
    hw_ctx ctx;
} hw_inst;

static const fc_impl_ops *inner(void) { return HW_INNER(); }
static hw_inst *inst(fc_impl *im) { return (hw_inst *)(void *)im; }
static const hw_inst *cinst(const fc_impl *im) { return (const hw_inst *)(const void *)im; }

static fc_impl *hw_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    if (env.bad[0]) {
        fc_fail(e, "%s", env.bad);
        return NULL;
    }
    static uint64_t runs;  // every instance of every process orders its atomics its own way
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    hw_inst *h = callocCheck(1, sizeof *h);
    int rank;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    h->ctx = (hw_ctx){.knobs = env.knobs, .seed = hw_mix(env.seed, cfg->seed), .compute = cfg->param_dtype,
                      .flat_offsets = cfg->fsdp_version == 1 && cfg->strategy != FC_STRATEGY_NO_SHARD &&
                                      cfg->strategy != FC_STRATEGY_LOCAL,
                      .nonce = hw_mix(hw_mix(++runs, (uint64_t)rank),
                                      (uint64_t)getpid() ^ ((uint64_t)now.tv_sec << 30) ^ (uint64_t)now.tv_nsec)};
    hw = h->ctx;
    h->inner = inner()->create(cfg, comm, e);
    if (!h->inner) {
        free(h);
        return NULL;
    }
    return (fc_impl *)(void *)h;
}

static int hw_step(fc_impl *im, fc_step_info *out, fc_error *e) {
    hw = inst(im)->ctx;
    return inner()->step(inst(im)->inner, out, e);
}

static int hw_export(fc_impl *im, fc_export what, float *dst, int root, fc_error *e) {
    return inner()->export_full(inst(im)->inner, what, dst, root, e);
}

static int hw_save(fc_impl *im, const char *dir, fc_state_dict kind, fc_error *e) {
    return inner()->save(inst(im)->inner, dir, kind, e);
}

static int hw_load(fc_impl *im, const char *dir, fc_error *e) { return inner()->load(inst(im)->inner, dir, e); }
static long hw_steps_done(const fc_impl *im) { return inner()->steps_done(cinst(im)->inner); }
static const fc_comm_log *hw_log(const fc_impl *im) { return inner()->comm_log(cinst(im)->inner); }
static void hw_memory(const fc_impl *im, fc_mem_stats *out) { inner()->memory(cinst(im)->inner, out); }

static void hw_destroy(fc_impl *im) {
    if (!im) return;
    inner()->destroy(inst(im)->inner);
    free(im);
}

static fc_impl_ops table;

// The one exported symbol of the library (everything else is hidden).
__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void);

const fc_impl_ops *fsdpcheck_impl_v1(void) {
    if (table.create) return &table;
    env_read();
    const fc_impl_ops *in = inner();
    table = (fc_impl_ops){.abi_version = FC_IMPL_ABI_VERSION, .name = env.name, .fsdp_versions = in->fsdp_versions,
                          .create = hw_create, .step = hw_step, .export_full = hw_export, .save = hw_save,
                          .load = hw_load, .steps_done = hw_steps_done, .comm_log = hw_log, .memory = hw_memory,
                          .destroy = hw_destroy};
    // its sums depend on the layout (ring against tree, a parameter's offset): never layout-invariant
    table.features = in->features & ~(FC_IMPL_LAYOUT_INVARIANT | FC_IMPL_DETERMINISTIC);
    if (!(env.knobs & HW_K_ATOMICS)) table.features |= in->features & FC_IMPL_DETERMINISTIC;
    size_t n = (size_t)snprintf(env.name, sizeof env.name, "%s[", in->features & FC_IMPL_FAULTS ? "hwlike+faults" : "hwlike");
    for (int k = 0; k < HW_K_COUNT && n < sizeof env.name; k++)
        if (env.knobs & (1u << k)) n += (size_t)snprintf(env.name + n, sizeof env.name - n, "%s%s",
                                                         env.name[n - 1] == '[' ? "" : ",", hw_knob_names[k]);
    if (n < sizeof env.name - 1) strcat(env.name, "]");
    return &table;
}
