// TEMPORARY STUB
#include "theory.h"
int fc_theory_check_schedule(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, fc_findings *out) { (void)cfg; (void)W; (void)rank; (void)log; (void)out; return 0; }
int fc_theory_check_memory(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, const fc_mem_stats *mem, fc_findings *out) { (void)cfg; (void)W; (void)rank; (void)log; (void)mem; (void)out; return 0; }
