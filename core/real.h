// core/real.h — the scalar type of the reference model math.
//
// The reference math (reference/layers.c, reference/model.c) is written once
// against `real` and compiled twice: as float for training (the fsdpcheck
// contract is fp32) and, with -DFC_REAL_DOUBLE, as double for the finite-
// difference tests (P13), where fp32 rounding would drown the check. RN()
// gives the double build its own symbol names so both can be linked together.
#ifndef FC_REAL_H
#define FC_REAL_H

#ifdef FC_REAL_DOUBLE
typedef double real;
#define RN(name) name##_f64
#else
typedef float real;
#define RN(name) name
#endif

#endif
