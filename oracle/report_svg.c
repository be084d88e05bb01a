// oracle/report_svg.c — the sweep report's plot (see sweep.h): per-rank
// model-state memory against W, measured per strategy, with the ZeRO curves.
#include "report_internal.h"

#include <math.h>
#include <stdio.h>

// ----------------------------------------------------------------------------
// SVG: per-rank model-state memory against W, with the ZeRO curves

#define SVG_W 920
#define SVG_H 500
#define PX0 100.0  // plot area
#define PX1 610.0
#define PY0 70.0
#define PY1 420.0

static const char *rp_color(int s) {
    static const char *const C[RP_NS] = {"#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e",
                                         "#d62728", "#9467bd", "#8c564b"};
    return C[rp_sidx(s)];
}

typedef struct {
    int wmax;
    double unit, top;  // y axis: bytes per unit, top of the axis in units
    const char *uname;
    double step;       // tick step in units
} rp_axes;

static double rp_sx(const rp_axes *a, double w) { return PX0 + (w - 0.5) / a->wmax * (PX1 - PX0); }
static double rp_sy(const rp_axes *a, double bytes) { return PY1 - bytes / a->unit / a->top * (PY1 - PY0); }

static void rp_plot_axes(const fc_sweep_report *r, rp_axes *a) {
    a->wmax = rp_plot_wmax(r);
    double ymax = 0;
    for (int i = 0; i < r->n_points; i++) ymax = fmax(ymax, (double)rp_point_bytes(&r->points[i]));
    if (r->plot_numel) ymax = fmax(ymax, rp_formula(RP_DDP, (double)r->plot_numel, 1));
    if (!(ymax > 0)) ymax = 1;
    static const char *const UN[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && ymax >= 1024.0 * pow(1024.0, u)) u++;
    a->unit = pow(1024.0, u);
    a->uname = UN[u];
    double v = ymax / a->unit, raw = v / 5;
    double mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    a->step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    a->top = ceil(v / a->step - 1e-9) * a->step;
    if (a->top <= 0) a->top = a->step;
}

// The document's head: size, title, description, background and the plot's titles.
static void svg_head(rp_buf *b, const fc_sweep_report *r) {
    rp_printf(b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
              SVG_W, SVG_H, SVG_W, SVG_H);
    rp_puts(b, "<title>Per-rank memory against world size</title>\n<desc>fsdpcheck sweep: per-rank bytes of "
               "model states (parameter, gradient and optimizer shards) plus gathered parameters, measured per "
               "strategy, against the ZeRO formulas for fp32 AdamW.</desc>\n");
    rp_printf(b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);

    // title
    rp_printf(b, "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">"
                 "Per-rank memory against W: ", (PX0 + PX1) / 2);
    rp_xml(b, r->plot_model[0] ? r->plot_model : "(no model)", sizeof r->plot_model);
    rp_puts(b, "</text>\n");
    rp_printf(b, "<text x=\"%.1f\" y=\"48\" text-anchor=\"middle\" fill=\"#444\">", (PX0 + PX1) / 2);
    if (r->plot_numel)
        rp_printf(b, "Ψ = %zu parameters, fp32 AdamW: params + grads + optimizer state + gathered params",
                  r->plot_numel);
    else
        rp_puts(b, "params + grads + optimizer state + gathered params (Ψ unknown: no formula curves)");
    rp_puts(b, "</text>\n");
}

// The grid, the ticks and the axes with their labels.
static void svg_axes(rp_buf *b, const rp_axes *a) {
    rp_puts(b, "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
    int nyt = (int)floor(a->top / a->step + 0.5);
    for (int k = 0; k <= nyt; k++) {
        double y = rp_sy(a, k * a->step * a->unit);
        rp_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", PX0, y, PX1, y);
    }
    rp_puts(b, "</g>\n<g text-anchor=\"end\">\n");
    for (int k = 0; k <= nyt; k++) {
        double y = rp_sy(a, k * a->step * a->unit);
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", PX0 - 8, y + 4, k * a->step);
    }
    rp_puts(b, "</g>\n<g text-anchor=\"middle\">\n");
    int every = (a->wmax + 15) / 16;
    for (int w = 1; w <= a->wmax; w += every) {
        double x = rp_sx(a, w);
        rp_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x, PY1, x,
                  PY1 + 5);
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%d</text>\n", x, PY1 + 20, w);
    }
    rp_puts(b, "</g>\n");
    rp_printf(b, "<path d=\"M %.1f %.1f V %.1f H %.1f\" fill=\"none\" stroke=\"black\"/>\n", PX0, PY0, PY1, PX1);
    rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">world size W (ranks)</text>\n",
              (PX0 + PX1) / 2, PY1 + 45);
    rp_printf(b, "<text x=\"30\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 30 %.1f)\">"
                 "per-rank bytes (%s)</text>\n", (PY0 + PY1) / 2, (PY0 + PY1) / 2, a->uname);
}

// The formula curves, sampled finely (1/W is not a straight line).
static void svg_formulas(rp_buf *b, const fc_sweep_report *r, const rp_axes *a) {
    double psi = (double)r->plot_numel;
    for (int f = 0; f < RP_NFORM; f++) {
        double w0 = 1, w1 = a->wmax;
        if (a->wmax == 1) w0 = 0.8, w1 = 1.2;  // a short level segment at W = 1
        rp_printf(b, "<polyline class=\"formula\" id=\"formula-%s\" fill=\"none\" stroke=\"%s\" "
                     "stroke-width=\"1.5\" stroke-dasharray=\"6 4\" points=\"",
                  f == RP_DDP ? "ddp" : f == RP_ZERO2 ? "zero2" : "zero3", rp_color(RP_FORM_STRATEGY[f]));
        const int N = 120;
        for (int i = 0; i <= N; i++) {
            double w = w0 + (w1 - w0) * i / N;
            double wf = a->wmax == 1 ? 1 : w;
            rp_printf(b, "%s%.1f,%.1f", i ? " " : "", rp_sx(a, w), rp_sy(a, rp_formula(f, psi, wf)));
        }
        rp_puts(b, "\"/>\n");
    }
}

// The measured points: one series per strategy present, radii differ so
// coinciding points (all strategies agree at W = 1) stay visible.
static void svg_points(rp_buf *b, const fc_sweep_report *r, const rp_axes *a, const int present[RP_NS]) {
    for (int s = 0; s < RP_NS; s++) {
        if (!present[s]) continue;
        double rad = s == FC_STRATEGY_NO_SHARD ? 7 : s == FC_STRATEGY_SHARD_GRAD_OP ? 5 : 3.5;
        int hollow = s == FC_STRATEGY_NO_SHARD || s == FC_STRATEGY_SHARD_GRAD_OP;
        rp_printf(b, "<g class=\"series\" id=\"series-%s\" stroke=\"%s\" stroke-width=\"2\" fill=\"%s\">\n",
                  rp_sname(s), rp_color(s), hollow ? "none" : rp_color(s));
        for (int i = 0; i < r->n_points; i++) {
            const fc_mem_point *p = &r->points[i];
            if (rp_sidx((int)p->strategy) != s) continue;
            size_t v = rp_point_bytes(p);
            rp_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\"><title>%s W=%d: %zu bytes</title></circle>\n",
                      rp_sx(a, p->W), rp_sy(a, (double)v), rad, rp_sname(s), p->W, v);
        }
        rp_puts(b, "</g>\n");
    }
    if (!r->n_points)
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no measured points</text>\n",
                  (PX0 + PX1) / 2, (PY0 + PY1) / 2);
}

// The legend: the strategies measured, then the formulas.
static void svg_legend(rp_buf *b, const fc_sweep_report *r, const int present[RP_NS]) {
    double ly = PY0 + 10;
    rp_printf(b, "<g class=\"legend\">\n<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">measured</text>\n",
              PX1 + 25, ly);
    ly += 20;
    for (int s = 0; s < RP_NS; s++) {
        if (!present[s]) continue;
        int hollow = s == FC_STRATEGY_NO_SHARD || s == FC_STRATEGY_SHARD_GRAD_OP;
        rp_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" stroke=\"%s\" stroke-width=\"2\" fill=\"%s\"/>\n",
                  PX1 + 35, ly - 4, rp_color(s), hollow ? "none" : rp_color(s));
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", PX1 + 50, ly, rp_sname(s));
        ly += 20;
    }
    if (r->plot_numel) {
        ly += 10;
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">ZeRO formula</text>\n", PX1 + 25, ly);
        ly += 20;
        for (int f = 0; f < RP_NFORM; f++) {
            rp_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
                         "stroke-dasharray=\"6 4\"/>\n",
                      PX1 + 25, ly - 4, PX1 + 45, ly - 4, rp_color(RP_FORM_STRATEGY[f]));
            rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s (%s)</text>\n", PX1 + 50, ly, RP_FORM_NAME[f],
                      rp_sname(RP_FORM_STRATEGY[f]));
            ly += 20;
        }
    }
    rp_puts(b, "</g>\n");
}

void rp_svg(rp_buf *b, const fc_sweep_report *r) {
    rp_axes a;
    rp_plot_axes(r, &a);
    svg_head(b, r);
    svg_axes(b, &a);
    if (r->plot_numel) svg_formulas(b, r, &a);
    int present[RP_NS] = {0};
    for (int i = 0; i < r->n_points; i++) present[rp_sidx((int)r->points[i].strategy)] = 1;
    svg_points(b, r, &a, present);
    svg_legend(b, r, present);
    rp_puts(b, "</svg>\n");
}
