"""The run's own peak memory, across every twin of every check, beside one twin's step peak.

Each CUDA measurement resets torch's peak statistics right before the step it measures
(``torch.cuda.reset_peak_memory_stats``), which would lose the process-wide peak; every reset goes
through :func:`reset_peaks`, which first folds the peaks so far into the run's own. On the CPU the
run's peak is the process's peak resident set (``getrusage``: weights of the one build, every twin's
training state while it is resident, the plain results a check keeps, and the interpreter itself).

Each check of a run is a phase with a peak of its own (:func:`phase_peak`): on CUDA torch's peak statistics are
reset before it; on Linux the resident-set high-water mark is reset (``echo 5 > /proc/self/clear_refs``,
proc(5)) after folding it into the run's own, so the run's peak stays whole and names the phase that reached it.
"""

from __future__ import annotations

import re
import resource
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

#: ``{device index: [max allocated, max reserved]}`` (bytes) before the last reset of this process.
_FOLDED: dict[int, list[int]] = {}
#: ``{device index: max allocated}`` (bytes) folded since the current phase began (:func:`phase_peak`).
_PHASE: dict[int, int] = {}


def _fold(device: torch.device | None) -> list[int]:
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    kept = _FOLDED.setdefault(index, [0, 0])
    kept[0] = max(kept[0], torch.cuda.max_memory_allocated(index))
    kept[1] = max(kept[1], torch.cuda.max_memory_reserved(index))
    _PHASE[index] = max(_PHASE.get(index, 0), torch.cuda.max_memory_allocated(index))
    return kept


def reset_peaks(device: torch.device) -> None:
    """``torch.cuda.reset_peak_memory_stats(device)``, keeping the peaks so far as the run's own."""
    _fold(device)
    torch.cuda.reset_peak_memory_stats(device)


def run_device_peak(device: torch.device | None = None) -> tuple[int, int] | None:
    """``(max allocated, max reserved)`` bytes of this process on a CUDA ``device`` (default: the
    current one) over the whole run, peak resets included; None where CUDA was never initialised."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    kept = _fold(device)
    return kept[0], kept[1]


#: The host peak (bytes) before the last reset of the resident-set high-water mark of this process.
_HOST_FOLDED = [0]


def _host_peak_now() -> int:
    """The resident-set high-water mark since the last reset, bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def run_host_peak() -> int:
    """This process's peak resident set over the whole run, bytes, phase resets included."""
    return max(_HOST_FOLDED[0], _host_peak_now())


def reset_host_peak() -> bool:
    """Fold the high-water mark into the run's own and reset it (Linux ``/proc/self/clear_refs``, value 5).

    Returns:
        False where the kernel does not offer the reset (not Linux, or a read-only /proc): the mark then
        keeps counting from the start of the process and a phase's peak is an upper bound.
    """
    _HOST_FOLDED[0] = run_host_peak()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def host_resident() -> int:
    """This process's resident set now, bytes (``VmRSS`` of /proc/self/status; 0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0


@dataclass
class PhasePeak:
    """The peak of one phase of a run (a check).

    Attributes:
        phase: the check's name.
        bytes: on CUDA the peak allocated bytes during the phase, elsewhere the peak resident set, B.
        metric: ``"peak_allocated_bytes"`` or ``"peak_rss_bytes"``.
        exact: False where the host mark could not be reset (the figure is the process's peak so far, a bound).
        resident_before: resident set (host) or allocated bytes (CUDA) when the phase began, B.
    """

    phase: str
    bytes: int = 0
    metric: str = "peak_rss_bytes"
    exact: bool = True
    resident_before: int = 0


@contextmanager
def phase_peak(phase: str, device: torch.device) -> Iterator[PhasePeak]:
    """Measure the peak of the code run inside: the yielded :class:`PhasePeak` is filled when the block ends
    (also when it raises)."""
    cuda = device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized()
    peak = PhasePeak(phase, metric="peak_allocated_bytes" if cuda else "peak_rss_bytes")
    if cuda:
        reset_peaks(device)
        _PHASE.clear()  # the checks inside reset the statistics again: each reset folds into the phase's peak
        peak.resident_before = torch.cuda.memory_allocated(device)
    else:
        peak.exact = reset_host_peak()
        peak.resident_before = host_resident()
    try:
        yield peak
    finally:
        if cuda:
            _fold(device)
            peak.bytes = max(_PHASE.values())
        else:
            peak.bytes = _host_peak_now()
