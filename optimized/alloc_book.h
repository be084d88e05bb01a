// optimized/alloc_book.h — the bookkeeping of the port's tagged allocator,
// pure host code (no CUDA), so it is unit-tested on a CPU.
//
// Every engine allocation (device memory from the port's stream-ordered pool,
// pinned host memory under cpu_offload, host staging of the MPI backend) is
// entered here with its location and memory category (core/schedule.h); the
// figures the contract reports (fc_mem_stats) are kept by fc_mem_add/sub. The
// book also answers "which live allocation holds [p, p+bytes)", which the
// test executor uses to catch a stale or out-of-bounds buffer, and checks the
// device figure against what the CUDA pool itself says is in use.
#ifndef FC_CUDA_ALLOC_BOOK_H
#define FC_CUDA_ALLOC_BOOK_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "schedule.h"

FC_BEGIN_DECLS

typedef struct {
    void *p;
    size_t bytes;      // counted bytes (what the category reports)
    fc_mem_loc loc;
    fc_mem_cat cat;
} fc_book_entry;

typedef struct {
    fc_book_entry *e;  // [n] live allocations
    size_t n, cap;
    fc_mem_stats stats;
    size_t live[FC_LOC_COUNT];  // live allocations per location
} fc_book;

void fc_book_init(fc_book *b);
void fc_book_free(fc_book *b);
// Enters a new allocation; -1 (with e set) if p is NULL or already live.
int fc_book_add(fc_book *b, void *p, size_t bytes, fc_mem_loc loc, fc_mem_cat cat, fc_error *e);
// Removes p, returning its entry in *out; -1 if p is not live (a double or
// foreign free).
int fc_book_remove(fc_book *b, void *p, fc_book_entry *out, fc_error *e);
// The live allocation that holds [p, p + bytes), or NULL.
const fc_book_entry *fc_book_find(const fc_book *b, const void *p, size_t bytes);
// Bytes currently counted at loc (all categories).
size_t fc_book_bytes(const fc_book *b, fc_mem_loc loc);

// The cross-check of the device figures against the allocator's own: the
// pool reports `pool_used` bytes in use; each of the `n_live` allocations may
// be rounded up by at most `granularity` bytes (and a zero-byte one takes
// one unit). 0 when consistent, else -1 with a one-line reason in e.
int fc_book_crosscheck(size_t tagged, size_t n_live, uint64_t pool_used, size_t granularity, fc_error *e);
// The same against the device's own count (cudaMemGetInfo): the device's
// used memory grew by `used_delta` bytes since the engine's baseline, which
// the pool's backing memory, hence the tagged bytes, cannot exceed. Only
// meaningful when no other process shares the device.
int fc_book_crosscheck_device(size_t tagged, uint64_t used_delta, fc_error *e);

FC_END_DECLS

#endif
