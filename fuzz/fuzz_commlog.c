// fuzz/fuzz_commlog.c — libFuzzer harness for the comm-log reader
// (fc_log_parse_jsonl, oracle/commlog_read.h) and the schedule theory that
// `fsdpcheck schedule` runs on what it accepts (oracle/theory.h): any log,
// however wrong, is either refused with a message or judged without a crash,
// and a judged log's findings are counted consistently.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "commlog_read.h"
#include "config.h"
#include "theory.h"

#define W 2

static void check(int ok) {
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fc_comm_log logs[W];
    for (int r = 0; r < W; r++) fc_log_init(&logs[r]);
    fc_error e;
    e.msg[0] = '\0';
    if (fc_log_parse_jsonl((const char *)data, size, "log.jsonl", W, logs, &e) != 0) {
        check(e.msg[0] != '\0');
    } else {
        // three configurations the reference logs: ZeRO-3 with prefetch and
        // the limiter, ZeRO-2 with accumulation under no_sync, DDP offloaded
        const char *models[] = {"gpt2-tiny", "mlp-micro", "mlp-tiny"};
        const fc_strategy strategies[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_NO_SHARD};
        for (int c = 0; c < 3; c++) {
            fc_run_config cfg;
            fc_run_config_defaults(&cfg);
            check(fc_model_config_load(models[c], &cfg.model, &e) == 0);
            cfg.strategy = strategies[c];
            cfg.steps = 2;
            if (c == 0) cfg.backward_prefetch = FC_PREFETCH_PRE, cfg.forward_prefetch = 1, cfg.limit_all_gathers = 1;
            if (c == 1) cfg.grad_accum = 2, cfg.no_sync = 1, cfg.global_batch = 8;
            if (c == 2) cfg.cpu_offload = 1;
            for (int r = 0; r < W; r++) {
                fc_findings f = {0};
                int n = fc_theory_check_schedule(&cfg, W, r, &logs[r], &f);
                check(n == f.n && f.n_kept <= f.n && f.n_kept <= 8);
                for (int i = 0; i < f.n_kept; i++) check(memchr(f.msg[i], 0, sizeof f.msg[i]) != NULL);
            }
        }
    }
    for (int r = 0; r < W; r++) fc_log_free(&logs[r]);
    return 0;
}
