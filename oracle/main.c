// oracle/main.c — the fsdpcheck command: dispatch to a subcommand.
#include <stdio.h>
#include <string.h>

#include "check.h"

int fc_cmd_run(int argc, char **argv);

static void usage(FILE *f) {
    fputs("usage: fsdpcheck <command> [flags]\n"
          "commands:\n"
          "  run       train with one implementation and write its trace (fsdpcheck run --help)\n"
          "exit codes: 0 pass, 1 a property or comparison failed, 2 bad input or usage\n",
          f);
}

int main(int argc, char **argv) {
    if (argc < 2) fc_die(FC_EXIT_USAGE, "no command given (see fsdpcheck --help)");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return FC_EXIT_PASS;
    }
    if (!strcmp(cmd, "run")) return fc_cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "check") || !strcmp(cmd, "sweep") || !strcmp(cmd, "compare") || !strcmp(cmd, "ckpt"))
        fc_die(FC_EXIT_USAGE, "'%s' is not in this build yet (only 'run' is)", cmd);
    fc_die(FC_EXIT_USAGE, "unknown command '%s' (see fsdpcheck --help)", cmd);
}
