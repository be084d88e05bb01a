// examples/plugin/plugin.c — the versioned entry point of an fsdpcheck
// implementation library. fsdpcheck dlopen()s the library, looks up
// FC_IMPL_ENTRY ("fsdpcheck_impl_v1"), and refuses a table whose
// abi_version differs from its own FC_IMPL_ABI_VERSION.
#include "impl.h"

__attribute__((visibility("default"))) const fc_impl_ops *fsdpcheck_impl_v1(void) {
    static fc_impl_ops ops;
    ops = *fc_reference_impl();  // a port fills this table with its own functions
    ops.name = "reference-plugin";
    return &ops;
}
