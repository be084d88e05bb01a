// TEMPORARY STUB (not committed): replaced by the theory branch
#ifndef FC_THEORY_H
#define FC_THEORY_H
#include "config.h"
#include "schedule.h"
typedef struct { int n; int n_kept; char msg[8][400]; } fc_findings;
int fc_theory_check_schedule(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, fc_findings *out);
int fc_theory_check_memory(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, const fc_mem_stats *mem, fc_findings *out);
#endif
