// oracle/findings.h — the bottom layer of the schedule and memory theory: a
// check's findings and whose schedule a comm log is. Both the rules (rules.c)
// and the theory's passes (theory*.c) report through it, so neither calls
// back into the other.
#ifndef FC_FINDINGS_H
#define FC_FINDINGS_H

// Findings of a check: how many violations, and the first few messages.
typedef struct {
    int n;             // violations found
    int n_kept;        // messages kept in msg (at most 8)
    char msg[8][400];  // the first ones, each one line: what was expected and what was found
} fc_findings;

// Counts one violation; keeps its message while there is room.
void fc_findings_add(fc_findings *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Whose schedule a comm log is. This project's engines follow docs/contract.md §5 as
// written. Real PyTorch FSDP, recorded by the adapter (fsdpcheck_torch/
// commlog.py), departs from it in a few places measured and named in docs/adapter.md
// ("Real FSDP's schedule"); the theory accepts each for its API alone
// (oracle/rules.h, the fc_rule_*_as functions).
typedef enum { FC_API_REFERENCE, FC_API_TORCH_FSDP1, FC_API_TORCH_FSDP2, FC_API_COUNT } fc_sched_api;
const char *fc_sched_api_name(fc_sched_api a);
// -1 for a name of none
int fc_sched_api_parse(const char *name, fc_sched_api *out);

#endif
