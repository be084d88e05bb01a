// bench/bench_step.c — time reference training steps of each preset, in one run.
//
// usage: fsdpcheck_bench [STEPS] [THREADS] [MODEL...]
// Each model runs one warm-up step and then STEPS timed steps (default 20 for
// the small models, 1 for gpt2-124m) on THREADS OpenMP threads (default: the
// cores; core/threads.h). MODELs (presets or config.json paths) replace the
// presets' list, each at B=4, T=64. It prints the median step time, throughput in tokens
// (samples for mlp) per second, the arithmetic rate (GFLOP/s: a training step
// is 3x the forward's multiply-adds, 2 FLOP each), and the time relative to
// gpt2-tiny, so the ratio between models is measured side by side.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "local.h"
#include "threads.h"

// FLOP of one training step (forward + backward = 3x the forward), counting the
// matmuls and attention's two products (causal: t + 1 keys for query t).
static double step_flop(const fc_model_config *m, int B, int T) {
    if (m->kind == FC_MODEL_LLAMA) {  // q, o [C, C]; k, v [C, kv]; gate, up, down [C, I]; the lm_head
        const double C = m->n_embd, L = m->n_layer, V = m->vocab_size, kv = (double)m->n_kv_head * m->head_dim;
        double per_token = L * (2 * C * C + 2 * C * kv + 3 * C * m->intermediate_size) + V * C;
        double attn = L * 2 * C * ((double)T + 1) / 2 * T;
        return 3 * 2 * (per_token * B * T + attn * B);
    }
    if (m->kind != FC_MODEL_GPT2) {
        double w = 0;  // the MLP's weights: one multiply-add each per sample
        for (int i = 0; i < m->n_layers; i++) w += (double)m->dims[i] * m->dims[i + 1];
        return 3 * 2 * w * B;
    }
    const double C = m->n_embd, L = m->n_layer, V = m->vocab_size;
    double per_token = L * 12 * C * C + V * C;             // qkv, proj, fc, fc_proj; the lm_head
    double attn = L * 2 * C * ((double)T + 1) / 2 * T;      // q.k and att.v over a sequence
    return 3 * 2 * (per_token * B * T + attn * B);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const char *model;
    int batch, seq_len, steps;
} bench_case;

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 0;
    int threads = fc_threads_setup(argc > 2 ? atoi(argv[2]) : 0, 1);  // one process
    printf("fsdpcheck_bench: %d threads\n", threads);
    bench_case presets[] = {
        {"mlp-tiny", 8, 16, 20},
        {"gpt2-tiny", 8, 16, 20},
        {"gpt2-tiny", 8, 32, 20},
        {"gpt2-124m", 4, 64, 1},
    };
    bench_case *cases = presets;
    int n = (int)(sizeof presets / sizeof presets[0]);
    if (argc > 3) {  // the models named, at the shape
        n = argc - 3;
        cases = mallocCheck(sizeof(bench_case) * (size_t)n);
        for (int i = 0; i < n; i++) cases[i] = (bench_case){argv[3 + i], 4, 64, 1};
    }
    double base = 0;
    printf("%-10s %5s %5s %12s %14s %10s %9s %8s\n", "model", "B", "T", "params", "ms/step", "tok/s",
           "GFLOP/s", "x tiny");
    for (int i = 0; i < n; i++) {
        fc_run_config cfg;
        fc_run_config_defaults(&cfg);
        fc_error e;
        if (fc_model_config_load(cases[i].model, &cfg.model, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 2;
        }
        cfg.global_batch = cases[i].batch;
        cfg.seq_len = cases[i].seq_len;
        fc_local L;
        if (fc_local_create(&L, &cfg, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 2;
        }
        int s = steps > 0 ? steps : cases[i].steps;
        fc_local_step(&L);  // warm-up: page in buffers
        double *t = mallocCheck(sizeof(double) * (size_t)s);
        for (int k = 0; k < s; k++) {
            double t0 = now_s();
            fc_local_step(&L);
            t[k] = now_s() - t0;
        }
        qsort(t, (size_t)s, sizeof *t, cmp_double);
        double med = t[s / 2];
        int is_gpt2 = fc_model_has_tokens(&cfg.model);  // tokens per sample: gpt2 and llama
        double tokens = (double)cfg.global_batch * (is_gpt2 ? cfg.seq_len : 1);
        if (i == 1 && cases == presets) base = med;
        char ratio[32] = "-";
        if (i >= 1 && base > 0) snprintf(ratio, sizeof ratio, "%.1f", med / base);
        double gflops = step_flop(&cfg.model, cfg.global_batch, cfg.seq_len) / med / 1e9;
        const char *name = strrchr(cases[i].model, '/') ? strrchr(cases[i].model, '/') + 1 : cases[i].model;
        printf("%-10s %5d %5d %12zu %14.3f %10.0f %9.2f %8s\n", name, cfg.global_batch,
               is_gpt2 ? cfg.seq_len : 0, L.model.numel, med * 1e3, tokens / med, gflops, ratio);
        free(t);
        fc_local_free(&L);
    }
    if (cases != presets) free(cases);
    return 0;
}
