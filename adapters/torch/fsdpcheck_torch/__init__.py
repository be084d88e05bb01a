"""fsdpcheck_torch: run real PyTorch FSDP on an fsdpcheck reference trace.

`torchrun --nproc-per-node W -m fsdpcheck_torch run --api fsdp1|fsdp2 ... --like REF --trace OUT`
trains the reference's model from the reference's initial weights on the
reference's batches with PyTorch FSDP and writes an fsdpcheck trace that
`fsdpcheck compare REF OUT` judges. `fsdpcheck-torch check` and `sweep` drive
the reference, torch and compare together.
"""

# fsdpcheck's version (CMakeLists.txt project()), the package's too (pyproject.toml reads it here)
__version__ = "0.6.0"
