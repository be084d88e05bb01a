// oracle/commlog_read.h — reading a comm log written as JSON lines (the format
// of `fsdpcheck run --comm-log FILE`, core/schedule.h's fc_log_write_jsonl),
// by this project's engines or by another implementation's recorder (the
// PyTorch adapter's), so that `fsdpcheck schedule` can judge it with P10.
#ifndef FC_COMMLOG_READ_H
#define FC_COMMLOG_READ_H

#include <stddef.h>

#include "check.h"
#include "schedule.h"

// Reads every event of the file into logs[rank] (logs: W initialised logs),
// in file order, which must be each rank's issue order. Every field is
// checked; -1 with e naming the file, the line and the field on bad input.
int fc_log_read_jsonl(const char *path, int W, fc_comm_log *logs, fc_error *e);
// The same from len bytes of text in memory (path names it in messages).
int fc_log_parse_jsonl(const char *text, size_t len, const char *path, int W, fc_comm_log *logs, fc_error *e);

#endif
