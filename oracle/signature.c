// oracle/signature.c — see signature.h. The driver: the shapes of
// signature_shapes.c tried in order through the engine (signature_engine.c).
#include "signature_internal.h"

#include <string.h>

void fc_signature_find(const fc_sig_input *in, fc_signature *out) {
    memset(out, 0, sizeof *out);
    fc_sig s;
    fc_sig_init(&s, in, out);
    int near_a = fc_sig_near_a(&s);
    if (!near_a) {
        if (s.n_bad_grad > 0) fc_sig_shapes_grad(&s);
        fc_sig_shapes_step(&s);
    } else {
        fc_sig_shape_dtype(&s);  // a grid is seen bit for bit, whatever the tolerance
    }
    if (!out->n_match)
        snprintf(out->text, sizeof out->text, "none of the known shapes%s",
                 near_a ? " (B is within the default tolerances of A: a difference only bitwise comparison sees)" : "");
    fc_sig_free(&s);
}

void fc_signature_print(FILE *f, const fc_signature *s) { fprintf(f, "signature: %s\n", s->text); }
