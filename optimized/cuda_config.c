// optimized/cuda_config.c — see cuda_config.h.
#include "cuda_config.h"

#include <limits.h>

#include "acts.h"
#include "layout.h"
#include "model.h"
#include "optim.h"

int fc_cuda_config_check(const fc_run_config *cfg, int W, fc_error *e) {
    if (fc_run_config_validate(cfg, e) || fc_run_config_validate_world(cfg, W, e)) return -1;
    if (cfg->strategy == FC_STRATEGY_LOCAL && W != 1)
        return fc_fail(e, "--strategy local runs as one process, not %d", W);
    if (cfg->act_ckpt != FC_ACT_CKPT_NONE)
        return fc_fail(e, "--activation-checkpointing %s: the CUDA port does not recompute activations yet (the "
                          "reference does)", fc_act_ckpt_name(cfg->act_ckpt));
    if (cfg->inject != FC_FAULT_NONE)
        return fc_fail(e, "--inject %s: the fault catalogue is a build of the reference; the CUDA port has no injected faults",
                       fc_fault_name(cfg->inject));
    if (fc_model_has_tokens(&cfg->model) && cfg->seq_len > FC_CUDA_MAX_SEQ)
        return fc_fail(e, "--seq-len %d: the CUDA attention kernels take at most %d tokens", cfg->seq_len,
                       FC_CUDA_MAX_SEQ);
    // the MPI backend's counts are ints: every unit's padded size must fit
    fc_model m;
    fc_model_build_run(&m, cfg);
    fc_groups g = fc_groups_of(cfg, W, 0);
    const fc_layout_ops *lay = fc_layout_of(fc_layout_kind_of(cfg));
    int rc = 0;
    for (int u = 0; u < m.n_units && rc == 0; u++) {
        fc_unit_layout l = fc_unit_layout_in(lay, &m, u, &g);
        if (l.padded > (size_t)INT_MAX)
            rc = fc_fail(e, "unit %d holds %zu elements padded; the collectives count in int (at most %d)", u, l.padded,
                         INT_MAX);
    }
    fc_model_free(&m);
    return rc;
}

size_t fc_cuda_device_bytes(const fc_run_config *cfg, int W, int rank) {
    fc_model m;
    fc_model_build_run(&m, cfg);
    fc_groups g = fc_groups_of(cfg, W, rank);
    size_t pb = fc_prec_size(cfg->param_dtype), rb = fc_prec_size(cfg->reduce_dtype);
    const char *names[2];
    size_t n_state = (size_t)fc_optim_state_names(&cfg->optim, names);
    size_t shards = 0, gathered = 0, grad1 = 0, grad2 = 0, maxp = 0;
    const fc_layout_ops *lay = fc_layout_of(fc_layout_kind_of(cfg));
    for (int u = 0; u < m.n_units; u++) {
        fc_unit_layout l = fc_unit_layout_in(lay, &m, u, &g);
        shards += l.store * sizeof(float);  // the fp32 parameter shard
        // FSDP2 gathers into a wire buffer [P] and copies out to the unit [N]
        gathered += (lay->wire_is_natural ? l.padded : l.padded + l.numel) * pb;
        // A unit with no trainable parameter (LoRA's root, a --freeze that
        // takes a whole unit) has no gradient at all: no shard, no gathered
        // gradient, no reduction buffers, no optimizer state.
        if (!fc_unit_trains(&m, u)) continue;
        // optimizer state for trainable elements only: at most the unit's
        // trainable count, at most the shard
        size_t trainable = fc_model_trainable_in(&m, u, 0, m.units[u].numel);
        shards += l.store * sizeof(float) + (trainable < l.store ? trainable : l.store) * sizeof(float) * n_state;
        size_t gr = l.padded * pb;
        if (gr > grad1) {
            grad2 = grad1;
            grad1 = gr;
        } else if (gr > grad2) {
            grad2 = gr;
        }
        if (l.padded > maxp) maxp = l.padded;
    }
    int local = cfg->global_batch / W;
    int micro = local / (cfg->grad_accum > 0 ? cfg->grad_accum : 1);
    fc_cu_acts a;
    fc_cu_acts_layout(&a, &cfg->model, micro, fc_model_has_tokens(&cfg->model) ? cfg->seq_len : 0, cfg->param_dtype);
    size_t need = (cfg->cpu_offload ? 0 : shards) + gathered + grad1 + grad2 + 2 * maxp * rb + 2 * a.half +
                  FC_CUDA_WORKSPACE;
    fc_cu_acts_free(&a);
    fc_model_free(&m);
    return need;
}

int fc_cuda_memory_fits(size_t need, size_t free_bytes, int dev, const char *name, fc_error *e) {
    if (need <= free_bytes) return 0;
    return fc_fail(e, "this run needs about %.2f GiB of device memory but device %d (%s) has %.2f GiB free", need / 1073741824.0,
                   dev, name, free_bytes / 1073741824.0);
}
