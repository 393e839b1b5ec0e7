"""The run's own peak memory, across every twin of every check, beside one twin's step peak.

Each CUDA measurement resets torch's peak statistics right before the step it measures
(``torch.cuda.reset_peak_memory_stats``), which would lose the process-wide peak; every reset goes
through :func:`reset_peaks`, which first folds the peaks so far into the run's own. On the CPU the
run's peak is the process's peak resident set (``getrusage``: weights of the one build, every twin's
training state while it is resident, the plain results a check keeps, and the interpreter itself).
"""

from __future__ import annotations

import resource
import sys

import torch

#: ``{device index: [max allocated, max reserved]}`` (bytes) before the last reset of this process.
_FOLDED: dict[int, list[int]] = {}


def _fold(device: torch.device | None) -> list[int]:
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    kept = _FOLDED.setdefault(index, [0, 0])
    kept[0] = max(kept[0], torch.cuda.max_memory_allocated(index))
    kept[1] = max(kept[1], torch.cuda.max_memory_reserved(index))
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


def run_host_peak() -> int:
    """This process's peak resident set, bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
