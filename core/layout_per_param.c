// core/layout_per_param.c — FSDP2's layout (fully_shard, docs/contract.md §5): every
// parameter is split on dim 0 as torch.chunk splits it over G ranks, c =
// ceil(rows / G) rows each, so rank j holds rows [j*c, min((j+1)*c, rows))
// (trailing ranks fewer, or none) in a buffer of c rows, zero-padded at its
// end. A rank's chunk of a unit is its padded shards of the unit's
// parameters in order, so S = sum of c * cols, and the all-gather's output
// is rank-major: [rank 0: p0 rows | p1 rows | ...][rank 1: ...] — FSDP2's
// copy-in/copy-out layout.
#include "layout.h"

// rows, cols and c = ceil(rows / G) of the unit's k-th parameter
static const fc_param *unit_param(const fc_model *m, int u, int k, size_t *rows, size_t *cols, size_t *c, int G) {
    const fc_param *p = &m->params[m->unit_params[m->units[u].first_param + k]];
    *rows = (size_t)p->shape[0];
    *cols = p->numel / *rows;
    *c = (*rows + (size_t)G - 1) / (size_t)G;
    return p;
}

static size_t pp_chunk_size(const fc_model *m, int u, int G) {
    size_t S = 0, rows, cols, c;
    for (int k = 0; k < m->units[u].n_params; k++) {
        unit_param(m, u, k, &rows, &cols, &c, G);
        S += c * cols;
    }
    return S;
}

static int pp_pieces(const fc_model *m, int u, int G, int j, fc_piece *out) {
    int n = 0;
    size_t at = 0, rows, cols, c;  // at: the parameter's shard in the chunk
    for (int k = 0; k < m->units[u].n_params; k++) {
        const fc_param *p = unit_param(m, u, k, &rows, &cols, &c, G);
        size_t r0 = (size_t)j * c, r1 = r0 + c < rows ? r0 + c : rows;
        if (r0 < r1) out[n++] = (fc_piece){p->unit_offset + r0 * cols, at, (r1 - r0) * cols};
        at += c * cols;
    }
    return n;
}

static int pp_owner(const fc_model *m, int u, int G, size_t i) {
    size_t rows, cols, c;
    for (int k = 0; k < m->units[u].n_params; k++) {
        const fc_param *p = unit_param(m, u, k, &rows, &cols, &c, G);
        if (i >= p->unit_offset && i < p->unit_offset + p->numel) return (int)((i - p->unit_offset) / cols / c);
    }
    return -1;
}

// each parameter's c padded rows, whatever j holds of them
static int pp_slots(const fc_model *m, int u, int G, int j, fc_piece *out) {
    (void)j;
    size_t at = 0, rows, cols, c;
    int k = 0;
    for (; k < m->units[u].n_params; k++) {
        const fc_param *p = unit_param(m, u, k, &rows, &cols, &c, G);
        out[k] = (fc_piece){p->unit_offset, at, c * cols};
        at += c * cols;
    }
    return k;
}

const fc_layout_ops fc_layout_per_param = {"per_param", 0, pp_chunk_size, pp_pieces, pp_owner, pp_slots};
