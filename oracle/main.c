// oracle/main.c — the fsdpcheck command: dispatch to a subcommand.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "impl.h"  // FC_IMPL_ABI_VERSION

// the package version (the CMake project version, cmake/install.cmake)
#ifndef FSDPCHECK_VERSION
#define FSDPCHECK_VERSION "unknown"
#endif

int fc_cmd_run(int argc, char **argv);
int fc_cmd_sweep(int argc, char **argv);
int fc_cmd_compare(int argc, char **argv);
int fc_cmd_ckpt(int argc, char **argv);
int fc_cmd_check(int argc, char **argv);
int fc_cmd_sensitivity(int argc, char **argv);
int fc_cmd_schedule(int argc, char **argv);
int fc_cmd_plan(int argc, char **argv);

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);  // the command's flags: argv[0] is the first
} COMMANDS[] = {
    {"run", fc_cmd_run},         {"sweep", fc_cmd_sweep},       {"compare", fc_cmd_compare},
    {"ckpt", fc_cmd_ckpt},       {"check", fc_cmd_check},       {"sensitivity", fc_cmd_sensitivity},
    {"schedule", fc_cmd_schedule}, {"plan", fc_cmd_plan},
};

static void usage(FILE *f) {
    fputs("usage: fsdpcheck <command> [flags]\n"
          "commands:\n"
          "  run       train with one implementation and write its trace (fsdpcheck run --help)\n"
          "  check     run an implementation beside another, comparing every step (--impl X)\n"
          "  sweep     check random cases against the properties; shrink and report failures\n"
          "  compare   compare two traces step by step (fsdpcheck compare --help)\n"
          "  plan      a run's initial weights and batches as a trace, no step run, to compare a run against\n"
          "  ckpt      inspect, verify or convert a checkpoint (fsdpcheck ckpt --help)\n"
          "  sensitivity  the smallest error compare catches between two traces, per kind\n"
          "  schedule     P10 on a comm log written elsewhere (--world W and the run's flags)\n"
          "  --version    the package version and the implementation contract's ABI version\n"
          "exit codes: 0 pass, 1 a property or comparison failed, 2 bad input or usage,\n"
          "            3 a timeout (a hung rank or collective), 4 an internal error\n",
          f);
}

int main(int argc, char **argv) {
    if (argc < 2) fc_die(FC_EXIT_USAGE, "no command given (see fsdpcheck --help)");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return FC_EXIT_PASS;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("fsdpcheck %s (implementation contract ABI %d, entry point %s)\n", FSDPCHECK_VERSION,
               FC_IMPL_ABI_VERSION, FC_IMPL_ENTRY);
        return FC_EXIT_PASS;
    }
    // the watchdog ends a hung job with MPI_Abort after printing its own line:
    // MPICH's message would only repeat it (read at MPI_Init; a user's own
    // setting wins)
    if (setenv("MPIR_CVAR_SUPPRESS_ABORT_MESSAGE", "1", 0) != 0)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: setenv: %s", __FILE__, __LINE__, strerror(errno));
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(cmd, COMMANDS[i].name)) return COMMANDS[i].run(argc - 2, argv + 2);
    fc_die(FC_EXIT_USAGE, "unknown command '%s' (see fsdpcheck --help)", cmd);
}
