// oracle/cli.h — command-line flags shared by the fsdpcheck subcommands.
#ifndef FC_CLI_H
#define FC_CLI_H

#include "check.h"
#include "checkpoint.h"
#include "config.h"
#include "fsdp_config.h"

typedef struct {
    fc_run_config cfg;
    char trace_dir[1024];   // --trace DIR, "" = none
    int trace_tensor_steps; // --trace-tensors first: the tensor sets of the first step only (1); all: 0
    char comm_log[1024];    // --comm-log FILE, "" = none
    int quiet;              // --quiet: no per-step lines
    char save_dir[1024];    // --save DIR, "" = none
    int save_at;            // --save-at K: save after step K of this run (1..steps; the last by default)
    fc_state_dict state_dict;  // --state-dict full|sharded (full)
    int state_dict_set;
    char load_dir[1024];    // --load DIR, "" = none
    fc_fsdp_config fsdp;    // --fsdp-config FILE (fsdp.path "" = none)
    double timeout;         // --timeout S: the watchdog's limit without progress (core/watchdog.h)
    int threads;            // --threads N (core/threads.h); 0 = the default, cores / ranks on the node
} fc_run_args;

// The watchdog's default: generous for a CPU step of gpt2-124m and a GPU step
// of anything, short enough that a hung CI job says why.
#define FC_DEFAULT_TIMEOUT 600.0

// Parses `fsdpcheck run` flags (argv[0] is the first flag). Returns 0, or -1
// with e naming the bad flag or value; 1 when --help was asked for.
int fc_cli_parse_run(int argc, char **argv, fc_run_args *out, fc_error *e);
void fc_cli_usage(FILE *f);
// `--world W` of the commands that take a run's flags without running it
// (plan, schedule): an integer in 1..FC_CLI_WORLD_MAX into *W, else -1.
#define FC_CLI_WORLD_MAX 1024
int fc_cli_parse_world(const char *v, int *W);

#endif
