// core/real.h — the scalar type of the reference model math.
//
// The reference math (reference/layers.c, reference/model.c) is written once
// against `real` and compiled twice: as float for training (the fsdpcheck
// contract is fp32) and, with -DFC_REAL_DOUBLE, as double for the finite-
// difference tests (P13), where fp32 rounding would drown the check. RN()
// gives the double build (and the magnitude build) its own symbol names so all can be
// linked together.
#ifndef FC_REAL_H
#define FC_REAL_H

#if defined(FC_REAL_DOUBLE)
typedef double real;
#define RN(name) name##_f64
#elif defined(FC_MAGNITUDE)
// The magnitude pass (reference/magnitude.c): float, with every parameter
// gradient summed in absolute value (MAG() in layers.c), its own symbol names.
typedef float real;
#define RN(name) name##_mag
#else
typedef float real;
#define RN(name) name
#endif

#endif
