// optimized/alloc_book.c — see alloc_book.h.
#include "alloc_book.h"

#include <stdlib.h>
#include <string.h>

void fc_book_init(fc_book *b) { memset(b, 0, sizeof *b); }

void fc_book_free(fc_book *b) {
    free(b->e);
    memset(b, 0, sizeof *b);
}

static long find_exact(const fc_book *b, const void *p) {
    for (size_t i = 0; i < b->n; i++)
        if (b->e[i].p == p) return (long)i;
    return -1;
}

int fc_book_add(fc_book *b, void *p, size_t bytes, fc_mem_loc loc, fc_mem_cat cat, fc_error *e) {
    if (!p) return fc_fail(e, "allocator: NULL allocation of %zu bytes (%s, %s)", bytes, fc_mem_loc_name(loc),
                           fc_mem_cat_name(cat));
    if (find_exact(b, p) >= 0) return fc_fail(e, "allocator: %p is already live", p);
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->e = reallocCheck(b->e, b->cap * sizeof *b->e);
    }
    b->e[b->n++] = (fc_book_entry){p, bytes, loc, cat};
    b->live[loc]++;
    fc_mem_add(&b->stats, loc, cat, bytes);
    return 0;
}

int fc_book_remove(fc_book *b, void *p, fc_book_entry *out, fc_error *e) {
    long i = find_exact(b, p);
    if (i < 0) return fc_fail(e, "allocator: free of %p, which is not a live allocation", p);
    fc_book_entry ent = b->e[i];
    b->e[i] = b->e[--b->n];  // order of the live set does not matter
    b->live[ent.loc]--;
    fc_mem_sub(&b->stats, ent.loc, ent.cat, ent.bytes);
    if (out) *out = ent;
    return 0;
}

const fc_book_entry *fc_book_find(const fc_book *b, const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < b->n; i++) {
        uintptr_t s = (uintptr_t)b->e[i].p;
        size_t len = b->e[i].bytes;
        if (a >= s && a - s <= len && bytes <= len - (a - s)) return &b->e[i];
    }
    return NULL;
}

size_t fc_book_bytes(const fc_book *b, fc_mem_loc loc) { return b->stats.cur_total[loc]; }

int fc_book_crosscheck(size_t tagged, size_t n_live, uint64_t pool_used, size_t granularity, fc_error *e) {
    if (pool_used < tagged)
        return fc_fail(e, "memory cross-check: the tagged allocator counts %zu device bytes but the pool has only %llu in use",
                       tagged, (unsigned long long)pool_used);
    uint64_t slack = (uint64_t)n_live * granularity;
    if (pool_used - tagged > slack)
        return fc_fail(e,
                       "memory cross-check: the pool has %llu device bytes in use, %llu more than the %zu tagged bytes "
                       "of %zu allocations can round up to (untagged device memory)",
                       (unsigned long long)pool_used, (unsigned long long)(pool_used - tagged), tagged, n_live);
    return 0;
}

int fc_book_crosscheck_device(size_t tagged, uint64_t used_delta, fc_error *e) {
    if (used_delta < tagged)
        return fc_fail(e,
                       "memory cross-check: the tagged allocator counts %zu device bytes but cudaMemGetInfo shows only %llu "
                       "more in use than at create",
                       tagged, (unsigned long long)used_delta);
    return 0;
}
