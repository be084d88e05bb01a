// core/layout_flat.c — FSDP1's FlatParameter layout (docs/contract.md §5): a unit's
// parameters flattened and concatenated, zero-padded at the end to S * G;
// chunk j is elements [j*S, (j+1)*S), so its real elements are one piece.
#include "layout.h"

static size_t flat_chunk_size(const fc_model *m, int u, int G) { return fc_chunk_size(m->units[u].numel, G); }

static int flat_pieces(const fc_model *m, int u, int G, int j, fc_piece *out) {
    size_t first, count;
    fc_flat_chunk(m->units[u].numel, G, j, &first, &count);
    if (!count) return 0;
    out[0] = (fc_piece){first, 0, count};
    return 1;
}

static int flat_owner(const fc_model *m, int u, int G, size_t i) {
    return (int)(i / fc_chunk_size(m->units[u].numel, G));
}

// each parameter's real elements in chunk j
static int flat_slots(const fc_model *m, int u, int G, int j, fc_piece *out) {
    size_t first, count;
    fc_flat_chunk(m->units[u].numel, G, j, &first, &count);
    int n = 0;
    for (int k = 0; k < m->units[u].n_params; k++) {
        const fc_param *p = &m->params[m->unit_params[m->units[u].first_param + k]];
        size_t a = p->unit_offset > first ? p->unit_offset : first;
        size_t b = p->unit_offset + p->numel < first + count ? p->unit_offset + p->numel : first + count;
        if (a < b) out[n++] = (fc_piece){a, a - first, b - a};
    }
    return n;
}

const fc_layout_ops fc_layout_flat = {"flat", 1, flat_chunk_size, flat_pieces, flat_owner, flat_slots};
