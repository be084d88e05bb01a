// core/threads.h — the OpenMP threads the reference's layers run on.
//
// Threads never change a bit of a result: every parallel loop in the reference
// splits *output elements* (matmul column panels, attention heads, rows of a
// norm or of the loss, parameter elements) among threads, and each element is
// still one sequential sum in the order fixed by its shapes (reference/layers.c,
// rule 1). So a run with 1, 2, 3 or 4 threads writes byte-identical traces
// (tests/mpi/threads_identical.sh).
#ifndef FC_THREADS_H
#define FC_THREADS_H

#include "check.h"

FC_BEGIN_DECLS

#define FC_THREADS_MAX 1024

// The default: the cores of this node divided by the ranks on it
// (fc_mpi_ranks_on_node, core/mpicheck.h), at least 1: mpiexec -n 4 on 2 cores
// runs one thread per rank. 1 in clang sanitizer builds (CMakeLists.txt: FC_THREADS_DEFAULT_ONE).
int fc_threads_default(int ranks_on_node);

// Sets the thread count of every later parallel loop: `requested` (1..FC_THREADS_MAX),
// or fc_threads_default(ranks_on_node) when requested is 0. Returns the count.
int fc_threads_setup(int requested, int ranks_on_node);

FC_END_DECLS

#endif
