"""A deadline and a memory ceiling around one check, so a hazard ends as a row, never a hang.

A recompute region that never returns, or a reentrant region that recurses in backward until
memory runs out (torch 2.13: a reentrant region returning a tensor it did not create), would
otherwise keep the run alive forever. :func:`limited` starts a watchdog thread that polls the
wall clock and the process's resident memory; when either passes its limit it interrupts the
main thread with ``SIGUSR1``, whose handler raises :class:`CheckLimitExceeded` there. That is a
``BaseException`` (like ``KeyboardInterrupt``), so the ``except Exception`` that turns a twin's
failure into a row inside a check does not swallow it: it ends the whole check, and the
pipeline writes one ERROR row naming the check, the limit and the likely cause.

Python delivers the signal between bytecodes, so a check stuck inside one long C call (a huge
matmul) is stopped when that call returns; every recompute hazard above runs Python code
(the region's forward, the backward of torch.utils.checkpoint's function) and is stopped within ``poll_s``.

The stop is never raised inside an import: a module left half-executed stays broken for the rest of
the process (a check stopped while torch imported sympy left every later check failing with "module
'sympy' has no attribute 'printing'"). The watchdog signals again every ``poll_s`` until the main
thread is outside the import system, or :data:`IMPORT_GRACE_S` has passed (an import that never
returns is still stopped); a body that ends before that signal lands is stopped as it ends, so the
overrun is still an ERROR row.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

#: Bytes in a GiB.
GIB = 2**30
#: Seconds the stop waits for an import in progress to finish before it interrupts the import anyway.
IMPORT_GRACE_S = 10.0


class CheckLimitExceeded(BaseException):
    """A check ran past ``checks.timeout_s`` or its process past ``checks.max_rss_gib``.

    Attributes:
        limit: ``"timeout_s"`` or ``"max_rss_gib"``.
        message: one sentence naming the limit, what was reached and the likely cause.
    """

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit, self.message = limit, message
        self.at = time.monotonic()  # when the limit was passed


def importing(frame: Any) -> bool:
    """True when ``frame`` or one of its callers runs inside the import system (``importlib``'s
    bootstrap frames), i.e. a module is being executed by an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def rss_bytes() -> int:
    """Resident memory of this process, bytes (``/proc/self/statm``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def physical_memory_bytes() -> int:
    """Physical memory of the machine, bytes (0 where unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def default_max_rss_gib() -> float | None:
    """The default ceiling, GiB: 90 % of physical memory (None where unknown). Generous on
    purpose: it is there to stop a runaway recursion before the machine swaps or the kernel's
    OOM killer ends the run without a report, not to judge a model's footprint."""
    total = physical_memory_bytes()
    return round(0.9 * total / GIB, 1) if total else None


@contextlib.contextmanager
def limited(name: str, timeout_s: float | None, max_rss_gib: float | None, poll_s: float = 0.1) -> Iterator[None]:
    """Run the body under a deadline and a resident-memory ceiling (module docstring).

    Args:
        name: the check's name, for the message.
        timeout_s: wall-clock seconds the body may take (None = no deadline).
        max_rss_gib: resident memory the process may reach, GiB (None = no ceiling).
        poll_s: how often the watchdog looks, s.

    Raises:
        CheckLimitExceeded: in the main thread, when a limit was passed.

    Outside the main thread (signals go to the main thread only) the body runs without limits.
    """
    if (timeout_s is None and max_rss_gib is None) or threading.current_thread() is not threading.main_thread():
        yield
        return
    reason: list[CheckLimitExceeded] = []
    done, delivered = threading.Event(), threading.Event()

    def on_signal(signum, frame) -> None:
        if reason and (not importing(frame) or time.monotonic() - reason[0].at > IMPORT_GRACE_S):
            delivered.set()
            raise reason[0]

    def watch(main: int, start: float) -> None:
        while not done.wait(poll_s):
            elapsed, rss = time.monotonic() - start, rss_bytes()
            if timeout_s is not None and elapsed > timeout_s:
                reason.append(
                    CheckLimitExceeded(
                        "timeout_s",
                        f"{name} was stopped after {elapsed:.1f} s, past checks.timeout_s={timeout_s:g}: a recompute "
                        "region that never returns, or backward recursing without end (a reentrant region that returns "
                        "a tensor it did not create) is the likely cause; raise checks.timeout_s if the check is just slow",
                    )
                )
            elif max_rss_gib is not None and rss > max_rss_gib * GIB:
                reason.append(
                    CheckLimitExceeded(
                        "max_rss_gib",
                        f"{name} was stopped when the process reached {rss / GIB:.2f} GiB resident memory, past "
                        f"checks.max_rss_gib={max_rss_gib:g}: backward recursing without end (a reentrant region that "
                        "returns a tensor it did not create) or a batch too large for this machine is the likely cause; "
                        "raise checks.max_rss_gib if the check needs the memory",
                    )
                )
            if reason:
                while not delivered.is_set():  # again while the main thread is inside an import
                    signal.pthread_kill(main, signal.SIGUSR1)
                    if done.wait(poll_s):
                        return
                return

    previous = signal.signal(signal.SIGUSR1, on_signal)
    watcher = threading.Thread(
        target=watch,
        args=(threading.main_thread().ident, time.monotonic()),
        name=f"reportgen-limits-{name}",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        done.set()
        try:
            watcher.join()
        finally:  # a signal that arrives late is ignored, never SIGUSR1's default (ending the process)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN if previous in (signal.SIG_DFL, None) else previous)
    if reason and not delivered.is_set():  # passed while an import ran, and the body ended before the next signal
        raise reason[0]


def check_limits(cfg: Any) -> tuple[float | None, float | None]:
    """``(checks.timeout_s, checks.max_rss_gib)``, the ceiling defaulting to 90 % of physical memory;
    no limits without a config (checks called directly, as tests do)."""
    if cfg is None:
        return None, None
    return cfg.checks.timeout_s, cfg.checks.max_rss_gib or default_max_rss_gib()
