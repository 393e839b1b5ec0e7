"""The report drawn beside the checks that remain: a forked worker process gets a head start on it.

Rendering costs about as much CPU as a third of the checklist's model work, and a third of that is
fixed: importing matplotlib and WeasyPrint, compiling the templates, drawing the plots of checks that
have already finished. Once no check that measures time is left (the warm-step time check runs with
nothing beside it), :func:`follow` forks a worker that does those things while the remaining checks
train; each later check's rows are sent to it as they finish, and its plots are drawn there too.
:func:`render_beside` then hands the worker the final frame: it renders report.html and report.pdf
(the same functions, so the same bytes as :func:`reportgen.report.render.render_report`), and this
process writes them.

The worker only computes; it writes no file and runs no torch code. Anything that goes wrong with it
(no ``fork`` on this platform, a distributed run, a worker that dies, raises or does not answer within
:data:`WAIT_S`) makes :func:`render_beside` return None and the pipeline renders in its own process as
before, so a report never depends on the worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from reportgen.checks import ROWS_TEMPLATE, Check, sections
from reportgen.checks import section as registered_section
from reportgen.checks.plots import draw_ahead
from reportgen.config import TIME
from reportgen.report.render import environment, render_pages, report_pdf
from reportgen.results import atomic_write, to_frame

log = logging.getLogger("reportgen")

#: Longest wait for the worker's report, seconds; past it the report is rendered in this process.
WAIT_S = 600.0


class Worker:
    """This process's end of a forked render worker.

    Attributes:
        process: the worker (``multiprocessing`` fork context, daemon).
        conn: this end of the pipe to it.
        sent: how many rows of the run have been sent (or were inherited at the fork).
    """

    def __init__(self, process: Any, conn: Any, sent: int):
        self.process, self.conn, self.sent = process, conn, sent

    def send_rows(self, rows: list) -> None:
        """Send the rows added since the last call, so the worker draws their plots now."""
        new, self.sent = rows[self.sent :], len(rows)
        if new:
            self.conn.send(("rows", new))

    def render(self, frame: pd.DataFrame, meta: dict, verdict: str, pdf: bool, required: list[str] | None):
        """The worker's ``(report.html, report.pdf bytes or None)``, or None when it could not give them."""
        self.conn.send(("render", (frame, meta, verdict, pdf, required)))
        deadline = time.monotonic() + WAIT_S
        while not self.conn.poll(0.5):
            if not self.process.is_alive() or time.monotonic() > deadline:
                return None
        reply = self.conn.recv()
        if reply[0] != "ok":
            log.warning("the report's worker could not render it (%s); rendering here", reply[1])
            return None
        return reply[1], reply[2]

    def stop(self) -> None:
        """Close the pipe and end the worker (it has nothing to save)."""
        self.conn.close()
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(5)


#: The worker of the run in progress in this process, or None.
_worker: Worker | None = None


def follow(registry: list[Check], index: int, rows: list, world_size: int = 1) -> None:
    """Called by the pipeline after check ``index`` of ``registry`` finished, with every row so far.

    Starts the worker once no check left measures time (and some check is left to overlap with);
    later calls send it the new rows. A single-process run on Linux only (fork; a distributed run
    keeps its process group to itself).
    """
    global _worker
    if _worker is not None:
        try:
            _worker.send_rows(rows)
        except (OSError, ValueError):  # a worker that went away: the report is rendered here
            stop()
        return
    timed = [i for i, check in enumerate(registry) if any(s.name == TIME for s in check.sections)]
    if index < max(timed, default=-1) or index >= len(registry) - 1 or world_size > 1:
        return
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return
    context = multiprocessing.get_context("fork")
    here, there = context.Pipe()
    process = context.Process(target=_serve, args=(there, list(rows)), name="reportgen-report", daemon=True)
    process.start()
    there.close()
    _worker = Worker(process, here, len(rows))


def render_beside(
    frame: pd.DataFrame, meta: dict, verdict: str, out_dir: Path, pdf: bool = True, required: list[str] | None = None
) -> dict[str, Path] | None:
    """Write report.html (and report.pdf) rendered by the worker; None when there is none or it failed.

    Same arguments, files and return value as :func:`reportgen.report.render.render_report`; the worker
    is ended either way.
    """
    global _worker
    worker, _worker = _worker, None
    if worker is None:
        return None
    try:
        files = worker.render(frame, meta, verdict, pdf, required)
    except Exception as exc:  # noqa: BLE001 - e.g. a value that cannot be pickled: render here
        log.warning("the report's worker could not be given the frame (%s); rendering here", exc)
        files = None
    finally:
        worker.stop()
    if files is None:
        return None
    html, pdf_bytes = files
    paths = {"html": atomic_write(out_dir / "report.html", html)}
    if pdf_bytes is not None:
        paths["pdf"] = atomic_write(out_dir / "report.pdf", pdf_bytes)
    return paths


def stop() -> None:
    """End the run's worker, if any (an interrupted run)."""
    global _worker
    worker, _worker = _worker, None
    if worker is not None:
        worker.stop()


def _serve(conn: Any, rows: list) -> None:
    """The worker: get ready, draw plots of the rows it is sent, then render the report it is asked for."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pipeline's to handle; it ends the worker
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _ready(rows, rows)
    while True:
        try:
            kind, payload = conn.recv()
        except EOFError:  # the pipeline went on without a report from here
            return
        if kind == "rows":
            rows += payload
            _ready(rows, payload)
            continue
        frame, meta, verdict, pdf, required = payload
        try:
            html, pdf_html = render_pages(frame, meta, verdict, required)
            conn.send(("ok", html, report_pdf(frame, meta, pdf_html) if pdf else None))
        except Exception as exc:  # noqa: BLE001 - said to the pipeline, which renders in its own process
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return


def _ready(rows: list, new: list) -> None:
    """Load the report's libraries and templates (first call) and draw the plots of the checks in ``new``."""
    try:
        import matplotlib.backends.backend_svg  # noqa: F401 - loaded now, used by every plot
        import matplotlib.figure  # noqa: F401
        import weasyprint  # noqa: F401 - the PDF's layout engine

        env = environment()
        for name in dict.fromkeys(["report.html.j2", ROWS_TEMPLATE, *(s.template for s in sections() if s.template)]):
            env.get_template(name)
        frame = to_frame(rows)
        for check in dict.fromkeys(row.check for row in new):
            spec = registered_section(check)
            if spec is not None and spec.plotter is not None:
                draw_ahead(spec.plotter, frame[frame.check == check])
    except Exception as exc:  # noqa: BLE001 - a head start only: the report draws what is missing
        log.debug("report worker: %s", exc)
