// core/watchdog.h — a hung rank never hangs the job (docs/contract.md §7, exit code 3).
//
// fsdpcheck runs inside other teams' CI on ports that may still be broken: a
// rank that deadlocks in a collective, or is stopped, must not leave every
// other rank waiting forever in silence. Like PyTorch's NCCL watchdog, each
// rank runs one thread that sleeps between checks (no busy-wait is added to
// the ranks): when no live rank of the job has made progress for the timeout,
// every live rank exits with FC_EXIT_TIMEOUT, and one of them prints one line
// that names the step, phase, unit, the collective and its sequence number,
// and the ranks that did not arrive.
//
// Progress is what the ranks say they did: every comm-log event
// (core/schedule.h fc_log_add calls fc_watchdog_event, so every
// implementation that logs through core reports progress for free) and the
// marks the oracle sets at the contract's boundaries (a step, an export, a
// save). The ranks of one node share a small table in POSIX shared memory: a
// heartbeat each watchdog thread bumps (a stopped or dead rank's stops), and
// where its rank is. Across nodes the table is per node and the line says so.
#ifndef FC_WATCHDOG_H
#define FC_WATCHDOG_H

#include <mpi.h>

#include "check.h"
#include "hd.h"
#include "schedule.h"

FC_BEGIN_DECLS

// Collective over comm: starts this rank's watchdog with a timeout of
// timeout_s seconds of no progress anywhere (<= 0: no watchdog).
int fc_watchdog_start(MPI_Comm comm, double timeout_s, fc_error *e);
// Stops this rank's watchdog (not collective: a rank that finished is done,
// and a finished rank never counts as one that did not arrive).
void fc_watchdog_stop(void);

// Progress: an event of this rank's comm log (collective issues count the
// sequence number), or a mark at a boundary ("step", "export", "save", ...).
void fc_watchdog_event(const fc_event *ev);
void fc_watchdog_mark(long step, const char *what);

// Called on the rank that reports a timeout, with the line it printed,
// before the process exits (the sweep writes its reports there). It runs on
// the watchdog thread while the main thread is blocked: it must not call MPI.
typedef void (*fc_watchdog_hook)(const char *line, void *ctx);
void fc_watchdog_on_timeout(fc_watchdog_hook hook, void *ctx);

FC_END_DECLS

#endif
