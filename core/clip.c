// core/clip.c — see clip.h.
#include "clip.h"

#include <math.h>

double fc_grad_norm_accumulate(double acc, const float *g, size_t n, fc_norm_type type) {
    for (size_t i = 0; i < n; i++) {
        double a = fabs((double)g[i]);
        if (type == FC_NORM_INF)
            acc = a > acc ? a : acc;
        else
            acc += type == FC_NORM_1 ? a : a * a;
    }
    return acc;
}

static double finish(double acc, fc_norm_type type) { return type == FC_NORM_2 ? sqrt(acc) : acc; }

double fc_grad_norm_combine(const double *parts, int G, fc_norm_type type) {
    double total = 0;
    for (int j = 0; j < G; j++) {
        if (type == FC_NORM_INF)
            total = parts[j] > total ? parts[j] : total;
        else
            total += parts[j];
    }
    return finish(total, type);
}

double fc_grad_norm(const float *g, size_t n, fc_norm_type type) {
    return finish(fc_grad_norm_accumulate(0, g, n, type), type);
}

float fc_clip_coef(float max_norm, double total) { return (float)((double)max_norm / (total + 1e-6)); }

int fc_clip_applies(float max_norm, float coef) { return max_norm > 0 && coef < 1.0f; }
