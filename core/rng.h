// core/rng.h — the counter-based generator behind init and data (docs/contract.md §3).
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator behind cuRAND and PyTorch's CUDA RNG). A value is a pure
// function of (key, counter): there is no state to advance, so any rank can
// produce element i of any tensor without producing elements 0..i-1, and every
// world size, strategy and implementation sees the same bits.
#ifndef FC_RNG_H
#define FC_RNG_H

#include <stdint.h>
#include "hd.h"

FC_BEGIN_DECLS

typedef struct {
    uint32_t v[4];
} fc_u32x4;

// One Philox4x32-10 block: key (64 bits), counter (128 bits = hi:lo).
fc_u32x4 fc_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo);

// 64-bit FNV-1a of a string, then a splitmix64 finaliser: turns a tensor name
// into a stream id.
uint64_t fc_hash_str(const char *s);
// splitmix64 finaliser: mixes a 64-bit value (used to combine stream ids).
uint64_t fc_mix64(uint64_t x);

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
float fc_u01(uint32_t bits);
// Standard normal from the first two words of a block (Box-Muller in double,
// rounded once to float).
float fc_normal_from(fc_u32x4 r);

FC_END_DECLS

#endif
