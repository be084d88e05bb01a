// optimized/enc_buckets.c — see enc_buckets.h. A counting sort: stable, so
// positions stay ascending inside each token's bucket.
#include "enc_buckets.h"

#include <string.h>

int fc_enc_buckets(const int32_t *ids, int n, int V, int32_t *count, int32_t *tok, int32_t *off, int32_t *pos) {
    memset(count, 0, (size_t)V * sizeof *count);
    for (int p = 0; p < n; p++) count[ids[p]]++;
    int n_tok = 0, at = 0;
    for (int v = 0; v < V; v++) {
        if (!count[v]) continue;
        tok[n_tok] = v;
        off[n_tok] = at;
        int c = count[v];
        count[v] = at;  // from here on: the next free slot of v's bucket
        at += c;
        n_tok++;
    }
    off[n_tok] = at;
    for (int p = 0; p < n; p++) pos[count[ids[p]]++] = p;
    return n_tok;
}
