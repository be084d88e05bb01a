// tests/abi/wrong_version.c — a port built against another contract: its
// table says FC_IMPL_ABI_VERSION + 1. fsdpcheck must refuse it (exit 2, one
// line) before calling anything in it.
#include <fsdpcheck/impl.h>

__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void) {
    static const fc_impl_ops ops = {.abi_version = FC_IMPL_ABI_VERSION + 1, .name = "abi-wrong-version"};
    return &ops;
}
