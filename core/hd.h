// core/hd.h — what lets C++ and CUDA code use core/'s C headers:
//  - FC_HD marks an inline function that the C compilers and nvcc both
//    compile: __host__ __device__ under nvcc, nothing in C. core/round.h and
//    core/optim.h use it for the arithmetic a CUDA port shares with the
//    reference;
//  - FC_BEGIN_DECLS / FC_END_DECLS give core/'s functions C linkage when a
//    header is included from C++ (nvcc compiles .cu files as C++).
#ifndef FC_HD_H
#define FC_HD_H

#ifdef __CUDACC__
#define FC_HD __host__ __device__
#else
#define FC_HD
#endif

// _Noreturn is C11's spelling; C++ has [[noreturn]].
#ifdef __cplusplus
#define FC_NORETURN [[noreturn]]
#else
#define FC_NORETURN _Noreturn
#endif

#ifdef __cplusplus
#define FC_BEGIN_DECLS extern "C" {
#define FC_END_DECLS }
#else
#define FC_BEGIN_DECLS
#define FC_END_DECLS
#endif

#endif
