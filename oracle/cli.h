// oracle/cli.h — command-line flags shared by the fsdpcheck subcommands.
#ifndef FC_CLI_H
#define FC_CLI_H

#include "check.h"
#include "config.h"

typedef struct {
    fc_run_config cfg;
    char trace_dir[1024];   // --trace DIR, "" = none
    char comm_log[1024];    // --comm-log FILE, "" = none
    int quiet;              // --quiet: no per-step lines
} fc_run_args;

// Parses `fsdpcheck run` flags (argv[0] is the first flag). Returns 0, or -1
// with e naming the bad flag or value; 1 when --help was asked for.
int fc_cli_parse_run(int argc, char **argv, fc_run_args *out, fc_error *e);
void fc_cli_usage(FILE *f);

#endif
