"""The torch ranks started beside the reference's plan.

`check` of one config starts torchrun while `fsdpcheck plan` still writes the
run's initial weights and batches (--like DIR): the launcher's and the ranks'
imports (about 4 s of a gpt2-124m check, one core of two idle while torchrun
alone imports) then run beside the plan, not after it. A rank reads nothing
of --like before the plan is done: `check` names a file in ENV and writes it,
"ok" once the plan is written or "failed" when it is not, and every rank
waits for it (`ready`) just before it opens --like.
"""

import os
import time

from .fileio import write_whole

ENV = "FSDPCHECK_TORCH_PLAN"
OK = "ok"
FAILED = "failed"


def write_outcome(path, ok):
    """Writes the plan's outcome where the ranks look: whole or not at all (a
    rank never reads half of it)."""
    write_whole(path, OK if ok else FAILED)


def ready(pause=0.01):
    """In a rank: True at once without ENV; with it, waits for the plan's
    outcome and returns whether the plan was written. The wait has no limit of
    its own: `check` ends the run if the plan fails or hangs."""
    path = os.environ.get(ENV)
    if not path:
        return True
    while not os.path.exists(path):
        time.sleep(pause)
    with open(path) as f:
        return f.read() == OK
