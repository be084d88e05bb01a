"""What each rank of a torch run left behind when it failed (a leaf module: no torch).

`check` cannot learn why a torch run failed from torchrun: its ChildFailedError
banner names an exit code, not the rank's own error, and an abort after a whole
trace was written looks, from outside, like a finished run. So each worker
reports for itself, into the directory named by $FSDPCHECK_TORCH_REPORT:

  rank-R.fault   faulthandler's dump on SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL
                 ("Fatal Python error: Segmentation fault", then the faulting
                 thread's Python frames, innermost first);
  rank-R.error   a Python exception that ended the run: "usage" (bad input,
                 exit 2) or "error" (the run failed, exit 1), its one-line
                 message, then the traceback.

`collect` reads them back as Failure records; `check` turns those into its verdict.
"""

import faulthandler
import os
import re
from dataclasses import dataclass

from .errors import UsageError, refuse
from .fileio import write_whole

ENV = "FSDPCHECK_TORCH_REPORT"

# faulthandler's own words for each signal it handles (Modules/faulthandler.c)
SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}

_fault_file = None  # kept open for the process's life: faulthandler writes to its fd


@dataclass
class Failure:
    rank: int
    kind: str  # "signal", "error" or "usage"
    what: str  # the signal's name, or the exception's one line
    where: str  # the faulting frame, or the traceback's innermost frame ("" if none)
    text: str  # the whole report, for the known-bug signatures

    def line(self):
        at = f" at {self.where}" if self.where else ""
        return f"rank {self.rank}: {self.what}{at}"


def arm(rank):
    """Called by the worker first: faulthandler writes into rank-R.fault."""
    global _fault_file
    d = os.environ.get(ENV)
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    _fault_file = open(os.path.join(d, f"rank-{rank}.fault"), "w")  # noqa: SIM115 (open until the process ends)
    faulthandler.enable(file=_fault_file, all_threads=True)


def record(rank, kind, message, trace=""):
    """The worker's report of the exception that ended its run."""
    d = os.environ.get(ENV)
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"rank-{rank}.error")
    write_whole(path, f"{kind}\n{message}\n{trace}")


def guarded(rank, body):
    """A worker's run: body() with faulthandler armed and any exception
    recorded for `check`. Returns body's exit code, 2 for bad input found while
    running (a flag this torch cannot honour), 1 for any other exception."""
    arm(rank)
    try:
        return body()
    except UsageError as e:
        record(rank, "usage", str(e))
        return refuse(rank, str(e))
    except Exception as e:  # noqa: BLE001 (recorded for check, then the traceback as Python prints it)
        import traceback

        record(rank, "error", f"{type(e).__name__}: {e}", traceback.format_exc())
        traceback.print_exc()
        return 1


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def _frame(path, line, func):
    return f"{func} ({os.path.basename(path)}:{line})"


def parse_fault(rank, text):
    """A faulthandler dump -> Failure, or None when the file is empty."""
    m = re.search(r"Fatal Python error: ([^\n]+)", text)
    if not m:
        return None
    sig = SIGNALS.get(m.group(1).strip(), m.group(1).strip())
    # the faulting thread's innermost frame: the first one after "Current thread"
    cur = text.find("Current thread")
    where = ""
    for ln in text[max(cur, 0) :].splitlines():
        f = _FRAME.match(ln)
        if f:
            where = _frame(*f.groups())
            break
    return Failure(rank, "signal", sig, where, text)


def parse_error(rank, text):
    kind, _, rest = text.partition("\n")
    message, _, trace = rest.partition("\n")
    frames = [f for f in (_TB_FRAME.match(ln) for ln in trace.splitlines()) if f]
    where = _frame(*frames[-1].groups()) if frames else ""
    return Failure(rank, kind if kind in ("usage", "error") else "error", message, where, text)


_TB_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def collect(directory):
    """Every rank's failure in the report directory, in rank order."""
    out = []
    if not directory or not os.path.isdir(directory):
        return out
    names = sorted(os.listdir(directory), key=lambda n: (len(n), n))
    for n in names:
        m = re.fullmatch(r"rank-(\d+)\.(fault|error)", n)
        if not m:
            continue
        try:
            with open(os.path.join(directory, n), errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        r = int(m.group(1))
        fl = parse_fault(r, text) if m.group(2) == "fault" else parse_error(r, text)
        if fl is not None:
            out.append(fl)
    # a rank with both: the exception came first (a signal ends the process,
    # nothing is recorded after it), e.g. an abort while exiting after the error
    seen, res = set(), []
    for fl in sorted(out, key=lambda f: (f.rank, f.kind == "signal")):
        if fl.rank not in seen:
            seen.add(fl.rank)
            res.append(fl)
    return res
