// tests/abi/no_fsdp1.c — a port whose table declares no FSDP version
// (fsdp_versions 0, as a table written before ABI 2 would read): fsdpcheck
// must refuse it (exit 2, one line) before calling anything in it.
#include <fsdpcheck/impl.h>

__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void) {
    static const fc_impl_ops ops = {.abi_version = FC_IMPL_ABI_VERSION, .name = "abi-no-fsdp1"};
    return &ops;
}
