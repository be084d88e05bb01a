// oracle/compare_cmd_report.c — `compare --report FILE.md`: the verdict, both
// runs, the tolerance policy, the first divergence and every step's and
// tensor's errors as Markdown, written to a temporary file and renamed.
#include <stdint.h>
#include <stdio.h>

#include "compare_cmd.h"
#include "escape.h"
#include "fileio.h"

// Markdown text in a table cell, escaped as the sweep's report escapes it.
static void md_text(FILE *f, const char *s) {
    fc_escape(s, SIZE_MAX, FC_ESC_MD_TEXT, fc_esc_to_file, f);
}

// One cell of the runs table: row of trace t.
static void run_cell(FILE *f, const fc_trace *t, int row) {
    switch (row) {
    case 0: md_text(f, t->dir); break;
    case 1: md_text(f, t->impl); break;
    case 2: fputs(fc_strategy_name(t->cfg.strategy), f); break;
    case 3: fprintf(f, "%d", t->world_size); break;
    case 4:
        if (t->cfg.strategy == FC_STRATEGY_LOCAL || t->cfg.strategy == FC_STRATEGY_NO_SHARD) fputs("-", f);
        else fprintf(f, "%d", t->cfg.shard_group ? t->cfg.shard_group : t->world_size);
        break;
    case 5: fprintf(f, "%s / %s", fc_prec_name(t->cfg.param_dtype), fc_prec_name(t->cfg.reduce_dtype)); break;
    default: fprintf(f, "%ld..%ld", t->first_step, t->first_step + t->steps - 1); break;
    }
}

static void runs_table(FILE *f, const fc_trace_pair *p) {
    const fc_trace *tr[2] = {&p->a, &p->b};
    fprintf(f, "| | A (expected) | B (under test) |\n|---|---|---|\n");
    const char *rows[] = {"trace", "implementation", "strategy", "world size", "shard group", "param / reduce dtype",
                          "steps"};
    for (int row = 0; row < 7; row++) {
        fprintf(f, "| %s |", rows[row]);
        for (int s = 0; s < 2; s++) {
            fputc(' ', f);
            run_cell(f, tr[s], row);
            fputs(" |", f);
        }
        fputc('\n', f);
    }
}

static void policy_table(FILE *f, const fc_cmp_policy *pol) {
    fprintf(f, "\n## Tolerance policy (%s)\n\n| kind | lockstep (%s) | diverged (%s) |\n|---|---|---|\n",
            pol->bitwise ? "--bitwise" : pol->overridden ? "--rtol/--atol override" : fc_prec_name(pol->prec),
            fc_prec_name(pol->prec), fc_prec_name(pol->prec_div));
    for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
        char t[64], u[64];
        fc_cmp_fmt_kind_tol((fc_cmp_kind)k, &pol->tol[k], t, sizeof t);
        fc_cmp_fmt_kind_tol((fc_cmp_kind)k, &pol->div[k], u, sizeof u);
        fprintf(f, "| %s | %s | %s |\n", fc_cmp_kind_name((fc_cmp_kind)k), t, u);
    }
    fprintf(f, "\nAn element passes when |A - B| <= atol + rtol * scale, scale = max(max|A|, max|B|) of its tensor "
               "(parameters: beyond what the two sides' optimizer inputs explain); a tensor when ||A - B|| <= ntol * "
               "||A||. NaN matches only NaN.\n");
}

static void steps_table(FILE *f, const fc_cmp_result *res, int n_res) {
    fprintf(f, "\n## Per step\n\n| step | kind | tensors | max abs err | max err/scale | ULP at scale | norm ratio "
               "| of tolerance | row | result |\n|---:|---|---:|---:|---:|---:|---:|---:|---|---|\n");
    for (int i = 0; i < n_res; i++)
        for (int k = 0; k < FC_CMP_KIND_COUNT; k++) {
            const fc_cmp_kind_stats *s = &res[i].kinds[k];
            if (!s->n_tensors) continue;
            char a[32], b[32], u[32], n[32], h[32];
            fprintf(f, "| %ld | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", res[i].step,
                    fc_cmp_kind_name((fc_cmp_kind)k), s->n_tensors, fc_cmp_fmt_err(s->max_abs, a, sizeof a),
                    fc_cmp_fmt_err(s->max_scaled, b, sizeof b), fc_cmp_fmt_err(s->max_ulp, u, sizeof u),
                    fc_cmp_fmt_err(s->norm_ratio, n, sizeof n), fc_cmp_fmt_err(s->headroom, h, sizeof h),
                    res[i].lockstep ? "lockstep" : "diverged", s->n_failed ? "**FAIL**" : "pass");
        }
}

static void tensors_table(FILE *f, const fc_cmp_result *res, int n_res) {
    fprintf(f, "\n## Per tensor\n\n| step | tensor | elements | scale | max abs err | max err/scale | ULP at "
               "scale | norm ratio | outside tolerance | result |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < n_res; i++)
        for (int j = 0; j < res[i].n_tensors; j++) {
            const fc_cmp_tensor *t = &res[i].tensors[j];
            char sc[32], a[32], b[32], u[32], n[32];
            fprintf(f, "| %ld | ", res[i].step);
            md_text(f, t->name);
            fprintf(f, " | %zu | %s | %s | %s | %s | %s | %zu%s | %s", t->numel, fc_cmp_fmt_err(t->scale, sc, sizeof sc),
                    fc_cmp_fmt_err(t->max_abs, a, sizeof a), fc_cmp_fmt_err(t->max_scaled, b, sizeof b),
                    fc_cmp_fmt_err(t->max_ulp, u, sizeof u), fc_cmp_fmt_err(t->norm_ratio, n, sizeof n), t->n_bad,
                    t->norm_bad ? " + norm" : "", t->pass ? "pass" : "**FAIL**");
            if (t->note[0]) {
                fputs(": ", f);
                md_text(f, t->note);
            }
            fputs(" |\n", f);
        }
}

void fc_compare_write_report(const char *path, const fc_trace_pair *p, const fc_cmp_policy *pol,
                             const fc_cmp_result *res, int n_res, const fc_cmp_divergence *first) {
    char tmp[1200];
    fc_error e;
    FILE *f = fc_open_tmp(path, tmp, sizeof tmp, &e);
    if (!f) fc_die(FC_EXIT_USAGE, "--report %s: %s", path, e.msg);
    fprintf(f, "# fsdpcheck compare\n\n**Result: %s**\n\n", first->found ? "FAIL" : "PASS");
    runs_table(f, p);
    policy_table(f, pol);
    if (first->found) {
        fprintf(f, "\n## First divergence\n\n```\n");
        fc_cmp_print_divergence(f, first);
        fprintf(f, "```\n");
    }
    steps_table(f, res, n_res);
    tensors_table(f, res, n_res);
    if (ferror(f)) {
        fc_abort_tmp(f, tmp);
        fc_die(FC_EXIT_USAGE, "--report %s: write failed", path);
    }
    if (fc_commit_tmp(f, tmp, path, FC_DURABLE, &e)) fc_die(FC_EXIT_USAGE, "--report %s: %s", path, e.msg);
}
