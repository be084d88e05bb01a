// core/simd.h — which vector kernels the reference's hot loops may use on this CPU.
//
// The kernels never change a bit: the matmul's every step is one correctly rounded
// fused multiply-add in a fixed order (reference/layers.c), AdamW's every operation
// is a correctly rounded mul, add, sub, div or sqrt in fc_adamw_elem's order
// (core/optim.c), so the generic C loops and the AVX2 and AVX-512 ones write the
// same bits, and tests/mpi/threads_identical.sh compares their traces byte for byte.
//
// FSDPCHECK_MM_GENERIC=1 (set in the environment) keeps every loop generic C;
// FSDPCHECK_MM_AVX2=1 keeps them no wider than AVX2.
#ifndef FC_SIMD_H
#define FC_SIMD_H

#include <stdlib.h>

#if defined(__GNUC__) && !defined(FC_MM_PLAIN_C) && defined(__x86_64__)
#define FC_SIMD_X86 1
#endif

enum { FC_SIMD_GENERIC = 0, FC_SIMD_AVX2 = 1, FC_SIMD_AVX512 = 2 };

// The widest kernel set allowed here, decided on the first call in each translation unit.
// Any thread may make that call (the norm's fill runs inside parallel regions): the level is
// stored atomically, and every thread that decides it decides the same.
static inline int fc_simd_level(void) {
#ifdef FC_SIMD_X86
    static int level = -1;
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        l = !avx2 || getenv("FSDPCHECK_MM_GENERIC")                             ? FC_SIMD_GENERIC
            : !__builtin_cpu_supports("avx512f") || getenv("FSDPCHECK_MM_AVX2") ? FC_SIMD_AVX2
                                                                                  : FC_SIMD_AVX512;
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    return l;
#else
    return FC_SIMD_GENERIC;
#endif
}

#endif
