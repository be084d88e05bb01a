// examples/plugin/plugin.c — the port template: one function per entry of the
// implementation contract (<fsdpcheck/impl.h>), and the versioned entry point
// fsdpcheck loads (`fsdpcheck check|sweep --impl ./libmyport.so`).
//
// A real port replaces the body of each function with its own engine (see
// README.md: what each function must do, which ranks call it, which property
// checks it). This template delegates every call to the reference
// (fsdpcheck::reference), so it passes the gate as it stands, and proves the
// path end to end: an installed package, a separate CMake project, the
// contract header, the entry point, fsdpcheck_add_gate().
//
// It also carries one opt-in bug of its own, the kind the gate exists for:
// with FSDPCHECK_TEMPLATE_BUG=1 in the environment, export_full hands out
// gradients twice too large (summed over two ranks instead of averaged),
// and `fsdpcheck check --impl` must fail with the first divergence.
#include <stdlib.h>
#include <string.h>

#include <fsdpcheck/impl.h>

// The contract this port implements. A new fsdpcheck with another ABI version
// stops the build here (and CMakeLists.txt stops the configure): read what
// changed (core/impl.h lists what bumps it), adapt, then change the number.
_Static_assert(FC_IMPL_ABI_VERSION == 5, "this port implements fsdpcheck's implementation contract ABI 5");

// The port's own state; fsdpcheck only ever holds the pointer.
struct fc_impl {
    fc_impl *ref;  // this template: the reference's engine does the work
    int rank;      // this rank in the communicator given to create
    int bug;       // FSDPCHECK_TEMPLATE_BUG=1
    size_t numel;  // parameters in the full model (<fsdpcheck/model.h>)
};

static const fc_impl_ops *ref(void) { return fc_reference_impl(); }

// Collective over comm. Builds the model of cfg->model, sharded by
// cfg->strategy over comm (which the port may dup or split: hybrid
// strategies split it into shard and replica groups), with the initial
// weights of cfg->seed (or cfg->init_path), and the optimizer of cfg->optim.
// Bad input: NULL with e set, on every rank.
static fc_impl *port_create(const fc_run_config *cfg, MPI_Comm comm, fc_error *e) {
    fc_impl *im = calloc(1, sizeof *im);
    if (!im) {
        fc_fail(e, "template: out of memory");
        return NULL;
    }
    MPI_Comm_rank(comm, &im->rank);
    const char *bug = getenv("FSDPCHECK_TEMPLATE_BUG");
    im->bug = bug && !strcmp(bug, "1");
    fc_model m;  // the parameter registry: names, shapes, units, the flat layout
    fc_model_build_run(&m, cfg);
    im->numel = m.numel;
    fc_model_free(&m);
    im->ref = ref()->create(cfg, comm, e);
    if (!im->ref) {
        free(im);
        return NULL;
    }
    return im;
}

// Collective. One optimizer step: every micro-batch of cfg->grad_accum
// (forward, backward, gradient reduction; no_sync skips it until the last),
// clip_grad_norm if asked, the optimizer. out: the global mean loss and the
// total gradient norm of the step.
static int port_step(fc_impl *im, fc_step_info *out, fc_error *e) { return ref()->step(im->ref, out, e); }

// Collective. Copies one full fp32 tensor set (model layout, unpadded) to dst
// on rank `root`: the parameters after the step, the gradients of the step
// (reduced and divided, before clipping), or an optimizer state. Not part of
// the measured schedule or memory.
static int port_export_full(fc_impl *im, fc_export what, float *dst, int root, fc_error *e) {
    int rc = ref()->export_full(im->ref, what, dst, root, e);
    if (rc == 0 && im->bug && what == FC_EXPORT_GRADS && im->rank == root)
        for (size_t i = 0; i < im->numel; i++) dst[i] *= 2;  // the opt-in bug: summed over 2 ranks, not averaged
    return rc;
}

// Collective. A checkpoint of the state after the last step, in the format
// of <fsdpcheck/checkpoint.h> (FULL or SHARDED state dict): crash safe,
// manifest last. Optional (NULL: the P7 cases of the sweep fail).
static int port_save(fc_impl *im, const char *dir, fc_state_dict kind, fc_error *e) {
    return ref()->save(im->ref, dir, kind, e);
}

// Collective. Replaces the state just created with dir's (saved at any world
// size and strategy), refusing a checkpoint that fails verification or does
// not fit the config on every rank before anything changes. Optional, as save.
static int port_load(fc_impl *im, const char *dir, fc_error *e) { return ref()->load(im->ref, dir, e); }

// Local. Optimizer steps taken: the global step number of the next step (a
// loaded checkpoint's step count continues).
static long port_steps_done(const fc_impl *im) { return ref()->steps_done(im->ref); }

// Local. This rank's comm log: every collective (op, unit, group, bytes,
// dtype, phase, order) and compute event so far, checked against the theory
// of the strategy and prefetch policy (P10).
static const fc_comm_log *port_comm_log(const fc_impl *im) { return ref()->comm_log(im->ref); }

// Local. This rank's memory figures per category (params, grads, optimizer
// state, gathered units; activations and workspace), checked against the
// sharded formula (P11).
static void port_memory(const fc_impl *im, fc_mem_stats *out) { ref()->memory(im->ref, out); }

// Collective. Frees everything create made.
static void port_destroy(fc_impl *im) {
    ref()->destroy(im->ref);
    free(im);
}

// The entry point, by its versioned name (FC_IMPL_ENTRY). fsdpcheck refuses a
// table whose abi_version is not its own FC_IMPL_ABI_VERSION, and one with a
// NULL where create, step, export_full, comm_log, memory or destroy belongs.
__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void) {
    static const fc_impl_ops ops = {
        .abi_version = FC_IMPL_ABI_VERSION,
        .name = "template-port",
        .fsdp_versions = FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2),  // the reference's, wrapped
        // No claim about the arithmetic (FC_IMPL_LAYOUT_INVARIANT, FC_IMPL_DETERMINISTIC):
        // claim a bit only when your kernels and collectives guarantee it; without, the
        // gate judges your runs against each other per element, as against the reference.
        .features = FC_IMPL_ACT_CKPT,
        .create = port_create,
        .step = port_step,
        .export_full = port_export_full,
        .save = port_save,
        .load = port_load,
        .steps_done = port_steps_done,
        .comm_log = port_comm_log,
        .memory = port_memory,
        .destroy = port_destroy,
    };
    return &ops;
}
