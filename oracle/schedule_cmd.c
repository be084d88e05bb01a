// oracle/schedule_cmd.c — `fsdpcheck schedule LOG.jsonl --world W [run flags]`:
// P10 on a comm log written elsewhere. The log is JSON lines in the format of
// `run --comm-log` (oracle/commlog_read.h), from this project's engines or from
// a recorder of another implementation (the PyTorch adapter's); the run flags
// say which configuration produced it. Every rank's events are checked against
// the oracle's own statement of FSDP's rules (oracle/rules.h, via theory.h),
// never against core/layout.c's. One process, no MPI.
//
// Exit: 0 every rank's schedule is the theory's, 1 a violation (each printed,
// the first ones per rank), 2 bad input (one line).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commlog_read.h"
#include "flags.h"
#include "theory.h"

static _Noreturn void usage_fail(const char *msg) {
    fc_die(FC_EXIT_USAGE, "schedule: %s", msg);
}

static void usage(void) {
    printf("usage: fsdpcheck schedule LOG.jsonl --world W [--api reference|torch-fsdp1|torch-fsdp2] [run flags: "
           "--model, --strategy, --shard-group, "
           "--backward-prefetch, --forward-prefetch, --limit-all-gathers, --grad-accum, --no-sync, "
           "--cpu-offload, --param-dtype, --reduce-dtype, --steps, ...]\n"
           "P10 (comm log == theory) on every rank's events of LOG, against the oracle's own rules; --api: whose\n"
           "schedule LOG is (default reference): real FSDP's measured divergences (docs/adapter.md) are accepted for it "
           "alone\n");
}

// LOG, then --world W and --api A, this command's own, among run's flags;
// 1 when --help was asked for (printed for `schedule --help`, silent after LOG).
static int parse_args(int argc, char **argv, const char **path, int *W, fc_sched_api *api, fc_run_args *a) {
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        usage();
        return 1;
    }
    if (argc < 1 || argv[0][0] == '-') usage_fail("the comm log LOG.jsonl comes first (see fsdpcheck schedule --help)");
    *path = argv[0];
    enum { WORLD, API };
    static const fc_flag flags[] = {[WORLD] = {"--world", FC_FLAG_VALUE}, [API] = {"--api", FC_FLAG_VALUE}};
    char **rest = mallocCheck((size_t)argc * sizeof *rest);
    int nrest = 0;
    *W = 0;
    *api = FC_API_REFERENCE;
    fc_flags it = fc_flags_begin(argc - 1, argv + 1, flags, FC_FLAGS_COUNT(flags), NULL, FC_FLAGS_PASS);
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        const char *bad = id == WORLD && (!it.value || fc_cli_parse_world(it.value, W))
                              ? "--world W: an integer in 1..1024"
                          : id == API && (!it.value || fc_sched_api_parse(it.value, api))
                              ? "--api: reference, torch-fsdp1 or torch-fsdp2 (whose schedule the log is)"
                              : NULL;
        if (bad) {
            free(rest);
            usage_fail(bad);
        }
        if (id == FC_FLAGS_ARG) rest[nrest++] = (char *)it.arg;
    }
    if (!*W) {
        free(rest);
        usage_fail("--world W is required (the ranks that wrote the log)");
    }
    fc_error e;
    int rc = fc_cli_parse_run(nrest, rest, a, &e);
    free(rest);
    if (rc == 1) return 1;
    if (rc || fc_run_config_validate(&a->cfg, &e) || fc_run_config_validate_world(&a->cfg, *W, &e))
        fc_die(FC_EXIT_USAGE, "schedule: %s", e.msg);
    if (a->cfg.strategy == FC_STRATEGY_LOCAL) usage_fail("--strategy local schedules nothing to check");
    return 0;
}

// Every rank's events against the theory, printed; the ranks with violations.
static int check_ranks(const fc_run_args *a, int W, fc_sched_api api, const fc_comm_log *logs) {
    int failed = 0;
    for (int r = 0; r < W; r++) {
        fc_findings f = {0};
        int n = fc_theory_check_schedule_as(&a->cfg, W, r, api, &logs[r], &f);
        if (n == 0) {
            printf("  rank %d: %zu events: pass\n", r, logs[r].n);
            continue;
        }
        failed++;
        printf("  rank %d: %zu events: %d violation%s\n", r, logs[r].n, n, n == 1 ? "" : "s");
        for (int i = 0; i < f.n_kept; i++) printf("    %s\n", f.msg[i]);
        if (f.n > f.n_kept) printf("    ... and %d more\n", f.n - f.n_kept);
    }
    return failed;
}

int fc_cmd_schedule(int argc, char **argv) {
    const char *path;
    int W;
    fc_sched_api api;
    fc_run_args a;
    if (parse_args(argc, argv, &path, &W, &api, &a)) return FC_EXIT_PASS;
    fc_comm_log *logs = mallocCheck((size_t)W * sizeof *logs);
    for (int r = 0; r < W; r++) fc_log_init(&logs[r]);
    fc_error e;
    if (fc_log_read_jsonl(path, W, logs, &e)) {
        for (int r = 0; r < W; r++) fc_log_free(&logs[r]);
        free(logs);
        fc_die(FC_EXIT_USAGE, "schedule: %s", e.msg);
    }
    size_t total = 0;
    for (int r = 0; r < W; r++) total += logs[r].n;
    printf(
        "fsdpcheck schedule: %s, %zu events from %d rank(s); model %s, strategy %s, %d step(s), against the "
        "oracle's rules (P10) as %s runs them\n",
        path, total, W, a.cfg.model.name, fc_strategy_name(a.cfg.strategy), a.cfg.steps, fc_sched_api_name(api));
    int failed = check_ranks(&a, W, api, logs);
    for (int r = 0; r < W; r++) fc_log_free(&logs[r]);
    free(logs);
    printf("fsdpcheck schedule: %s (%d of %d rank(s) with violations)\n", failed ? "FAIL" : "PASS", failed, W);
    return failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
}
