"""The adapter's one error type, and how every rank refuses it (a leaf every module may import)."""

import sys
import time

# How long a rank other than 0 waits before it exits with 2. torchrun ends
# every worker as soon as one has exited: if rank 1 left first, rank 0 was
# killed before its line reached stderr. Seen in CI (the oldest pair's Trainer
# refusal at W=2 came back as a bare ChildFailedError). Every rank reaches the
# same refusal after the same parsing, so rank 0 is there within a second; the
# wait costs nothing in the usual case, since torchrun ends the waiting ranks
# once rank 0 has exited.
GRACE_S = 10.0


class UsageError(Exception):
    """Bad input: printed as one line on stderr, exit code 2."""


def refuse(rank, message, prog="fsdpcheck-torch"):
    """Bad input every rank found: rank 0 prints the one line; returns the exit code 2."""
    if rank == 0:
        print(f"{prog}: {message}", file=sys.stderr, flush=True)
    else:
        time.sleep(GRACE_S)
    return 2
