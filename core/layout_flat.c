// core/layout_flat.c — FSDP1's FlatParameter layout (DESIGN §5): a unit's
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

const fc_layout_ops fc_layout_flat = {"flat", 1, flat_chunk_size, flat_pieces, flat_owner};
