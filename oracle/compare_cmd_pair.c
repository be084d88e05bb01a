// oracle/compare_cmd_pair.c — the two traces `compare` and `sensitivity`
// read, and how A's side of a step is judged (compare_cmd.h).
#include "compare_cmd.h"

#include "layout.h"  // fc_divide_by

void fc_pair_open(fc_trace_pair *p, const char *dir_a, const char *dir_b) {
    fc_error e;
    p->dir_a = dir_a, p->dir_b = dir_b;
    if (fc_trace_open(dir_a, &p->a, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    if (fc_trace_open(dir_b, &p->b, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    fc_trace_init_file(&p->b, p->b_init, sizeof p->b_init);
}

void fc_pair_close(fc_trace_pair *p) {
    fc_trace_close(&p->a);
    fc_trace_close(&p->b);
}

long fc_pair_first_step(const fc_trace_pair *p) {
    return p->a.first_step > p->b.first_step ? p->a.first_step : p->b.first_step;
}

int fc_pair_rerun_open(fc_rerun *rr, const fc_trace_pair *p, fc_error *e) {
    return fc_rerun_open(rr, &p->a.cfg, p->a.world_size, p->b_init, e);
}

int fc_pair_magnitude_open(fc_rerun *mag, const fc_trace_pair *p, fc_error *e) {
    return fc_magnitude_open(mag, &p->a.cfg, p->a.world_size, p->b_init, e);
}

fc_cmp_ctx fc_pair_ctx(const fc_trace_pair *p, const fc_cmp_policy *pol, const fc_rerun *rr) {
    // the same model, so one registry describes both; B's config is the layout
    fc_cmp_ctx c = {&p->b.model, pol, &p->b.cfg, p->b.world_size, &p->a.cfg.optim, &p->a.cfg, p->a.world_size,
                    fc_cmp_impl_act32(p->a.impl), fc_cmp_impl_act32(p->b.impl), 0, 0};
    if (rr) {
        c.a_world = 1;                          // the re-run is one process
        c.a_divide_by = fc_divide_by(&rr->cfg, 1);  // dividing by F / W where F was set
        c.a_act32 = 1;                          // ... of the reference
    }
    return c;
}
