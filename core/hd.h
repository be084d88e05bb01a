// core/hd.h — FC_HD marks an inline function that the C compilers and nvcc
// both compile: __host__ __device__ under nvcc, nothing in C. core/round.h
// and core/optim.h use it for the arithmetic a CUDA port shares with the
// reference.
#ifndef FC_HD_H
#define FC_HD_H

#ifdef __CUDACC__
#define FC_HD __host__ __device__
#else
#define FC_HD
#endif

#endif
