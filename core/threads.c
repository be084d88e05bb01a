// core/threads.c — see threads.h.
#include "threads.h"

#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

int fc_threads_default(int on_node) {
#ifdef FC_THREADS_DEFAULT_ONE
    (void)on_node;
    return 1;  // clang sanitizer builds (CMakeLists.txt: LeakSanitizer and libomp)
#endif
    if (on_node < 1) on_node = 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);  // -1 when unknown: one thread
    long n = cores > 0 ? cores / on_node : 1;
    return n < 1 ? 1 : n > FC_THREADS_MAX ? FC_THREADS_MAX : (int)n;
}

int fc_threads_setup(int requested, int ranks_on_node) {
    int n = requested > 0 ? requested : fc_threads_default(ranks_on_node);
#ifdef _OPENMP
    omp_set_num_threads(n);
    omp_set_dynamic(0);  // exactly n, never fewer: the count printed is the count used
#else
    n = 1;
#endif
    return n;
}
