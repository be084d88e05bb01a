// tests/ports/hwlike/hwlike.h — the hardware-like port's arithmetic: which
// knobs are on, the run they belong to, and the helpers every kernel shares.
//
// The port is the reference engine compiled again (docs/contract.md §1: a port
// like any other, loaded by --impl) with its kernels and its collectives' sums
// done the way accelerators do them. Each knob stands for one real behaviour
// (README.md beside this file lists them) and can be set alone or with the
// others through FSDPCHECK_HWLIKE; every choice a knob makes is a pure
// function of FSDPCHECK_HWLIKE_SEED, the run's seed and the operands' shape
// and place, except the atomics', which change from run to run.
#ifndef HW_HWLIKE_H
#define HW_HWLIKE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

// The knobs, as bits of hw_ctx.knobs.
enum {
    HW_K_MATMUL = 1u << 0,     // fp32 accumulation order and split-K by shape and operand offset (cuBLASLt heuristics)
    HW_K_FMA = 1u << 1,        // every dot product's multiply-adds unfused (the reference fuses them)
    HW_K_COMPUTE16 = 1u << 2,  // 16-bit compute: GEMM and elementwise outputs rounded to param_dtype
    HW_K_RING = 1u << 3,       // reduce-scatter / all-reduce summed in ring order, each block from the next rank
    HW_K_TREE = 1u << 4,       // small all-reduces summed in tree order (NCCL's tree algorithm)
    HW_K_AVG = 1u << 5,        // divides done as a multiply by the reciprocal (NCCL's PreMulSum for ncclAvg)
    HW_K_ATTENTION = 1u << 6,  // online (flash) softmax over key blocks
    HW_K_NORMS = 1u << 7,      // one-pass (Welford) LayerNorm statistics, blocked RMSNorm sum of squares
    HW_K_ATOMICS = 1u << 8,    // embedding and bias gradients summed in a run-to-run order (nondeterministic)
    HW_K_COUNT = 9
};
// Every knob but atomics: the default, an honest deterministic port.
#define HW_K_DEFAULT ((1u << HW_K_COUNT) - 1u - HW_K_ATOMICS)
#define HW_K_ALL ((1u << HW_K_COUNT) - 1u)

// The knobs' names as FSDPCHECK_HWLIKE spells them, index = bit.
extern const char *const hw_knob_names[HW_K_COUNT];

// Parses FSDPCHECK_HWLIKE ("default" when unset or empty, "all", "none", or
// a comma list of knob names): 0, or -1 with a one-line reason in why.
int hw_knobs_parse(const char *s, unsigned *knobs, char *why, size_t cap);

// The arithmetic of the run in progress. Kernels read it; the port sets it
// when an instance is created and again before each of its steps, so runs
// that alternate in one process (the sweep's) each compute with their own.
typedef struct {
    unsigned knobs;    // HW_K_*
    uint64_t seed;     // FSDPCHECK_HWLIKE_SEED mixed with the run's seed
    fc_prec compute;   // the compute precision: param_dtype
    int flat_offsets;  // parameters sit at their offset in a flat buffer (FSDP1's FlatParameter, sharded);
                       // else each is its own aligned allocation (DDP, FSDP2's unsharded parameters)
    uint64_t nonce;    // differs between any two runs in a process: the atomics' order
} hw_ctx;

extern hw_ctx hw;

static inline int hw_on(unsigned knob) { return (hw.knobs & knob) != 0; }

// A 64-bit mix of a and b (splitmix64's finalizer over a ^ rotated b).
uint64_t hw_mix(uint64_t a, uint64_t b);

// x rounded to the compute precision when 16-bit compute is on and the
// compute precision is 16-bit; x itself otherwise.
float hw_r16(float x);
// The same over x[0..n).
void hw_r16n(float *x, size_t n);

// The alignment class of an operand, as cuBLASLt sees it: its address mod
// 256 bytes inside a flat parameter buffer (hw.flat_offsets), 0 for a tensor
// of its own. Engine buffers are 256-byte aligned in this port.
unsigned hw_align_class(const void *p);

// A random permutation of [0, n) for one atomics-ordered sum, fresh per call
// and per run (hw.nonce). perm must hold n.
void hw_atomic_order(size_t *perm, size_t n, uint64_t salt);

#endif
