"""Progress lines for the long phases (training runs, trajectory, timing), with or without a terminal.

On a terminal, a tqdm bar on stderr that redraws in place. Without one (a CI log, ``nohup``,
a SLURM job, a sweep's worker process), the same tqdm line (count, rate, time left) is
written as a ``reportgen`` log record (so into the run's ``*.log`` file and the console
handler) every :data:`LOG_INTERVAL_S` seconds and once at the end, never as carriage returns;
a phase over within :data:`LOG_DELAY_S` seconds writes none.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm.std import tqdm

log = logging.getLogger("reportgen")

#: Seconds between two progress lines when stderr is not a terminal (tqdm ``mininterval``).
LOG_INTERVAL_S = 20.0
#: Seconds before the first progress line when stderr is not a terminal (tqdm ``delay``): a phase
#: shorter than this writes no line at all, so short runs keep a short log.
LOG_DELAY_S = 5.0
#: Seconds between two redraws of a bar on a terminal (tqdm ``mininterval``).
TTY_INTERVAL_S = 0.5


class _LogLines:
    """A file-like object for tqdm that turns each redraw into one log line."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.last = logger, ""

    def write(self, text: str) -> int:
        """Log the redraw in ``text`` (carriage returns and blanks dropped); returns ``len(text)``."""
        line = text.replace("\r", "").strip()
        if line and line != self.last:
            self.last = line
            self.logger.info("progress: %s", line)
        return len(text)

    def flush(self) -> None:
        """Nothing to flush (the logging handlers flush themselves)."""


def progress(
    desc: str, total: float | None = None, unit: str = "it", interactive: bool | None = None, **kwargs: Any
) -> tqdm:
    """A tqdm bar that shows rate and time left on a terminal and as periodic log lines elsewhere.

    Args:
        desc: what progresses, e.g. ``"plain seed 0 batch 64"``.
        total: the count at the end (None = unknown: rate and count only, no time left).
        unit: what is counted (``ex``, ``step``, ``round``).
        interactive: stderr is a terminal (default: ``sys.stderr.isatty()``).
        **kwargs: passed to ``tqdm`` (e.g. ``postfix``).

    Returns:
        The bar; use it as a context manager or close it.
    """
    tty = sys.stderr.isatty() if interactive is None else interactive
    if tty:
        shown = {"leave": False, "file": sys.stderr, "mininterval": TTY_INTERVAL_S, "dynamic_ncols": True}
    else:
        shown = {"leave": True, "file": _LogLines(log), "mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S}
        shown |= {"delay": LOG_DELAY_S, "ncols": 100, "ascii": True}
    return tqdm(total=total, desc=desc, unit=unit, **shown, **kwargs)
