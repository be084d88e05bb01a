// tests/abi/no_entry.c — a shared library without the entry point
// fsdpcheck_impl_v1 (here misspelt): fsdpcheck must refuse it (exit 2, one line).
#include <fsdpcheck/impl.h>

__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl(void) {
    static const fc_impl_ops ops = {.abi_version = FC_IMPL_ABI_VERSION, .name = "abi-no-entry"};
    return &ops;
}
