"""Library warnings off the console: the known ones filtered precisely, the rest of a run's into its log.

A dependency's warning that the user cannot act on reads like a fault of their model. Two rules
(issue 44, item 5):

- :data:`KNOWN` lists warnings a dependency emits on every run or ``verify``, each by category *and* the
  module that emits it (never a blanket ignore); :func:`quiet_known_warnings` filters exactly those,
  at import of the package.
- :func:`warnings_to_log` sends every other warning raised while a run's job runs to the job's log file
  (Hydra's ``__main__.log``) through :func:`logging.captureWarnings`, and not to the console. Checks that
  record warnings as rows (``warnings.catch_warnings(record=True)``) still see them first.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections.abc import Iterable, Iterator

#: ``(module of the category, category, module that emits it (a regex), why it is not the user's)``.
KNOWN = [
    (
        "cryptography.utils",
        "CryptographyDeprecationWarning",
        r"pyhanko(\.|$)",
        "pyhanko imports cryptography's DSA key types to read any signature; reportgen signs and verifies ECDSA "
        "P-256 only (reportgen.trust.keys), so the deprecation of DSA is not the user's to act on",
    ),
]


def quiet_known_warnings() -> None:
    """Ignore each warning of :data:`KNOWN`, by its category and the module that emits it (a category whose
    library is not installed is skipped)."""
    for library, name, module, _ in KNOWN:
        try:
            category = getattr(importlib.import_module(library), name)
        except (ImportError, AttributeError):
            continue
        warnings.filterwarnings("ignore", category=category, module=module)


@contextlib.contextmanager
def warnings_to_log(handlers: Iterable[logging.Handler]) -> Iterator[None]:
    """While inside, a warning shown by :mod:`warnings` is a record of the ``py.warnings`` logger written by
    ``handlers`` only (a run's file handlers: its ``__main__.log``), never the console; on exit warnings are
    shown as before (a later job, or the rest of a test session, never writes into this run's log)."""
    logger = logging.getLogger("py.warnings")
    before = (logger.propagate, list(logger.handlers))
    logging.captureWarnings(True)
    logger.propagate = False
    logger.handlers = [*handlers] or [logging.NullHandler()]
    try:
        yield
    finally:
        logging.captureWarnings(False)
        logger.propagate, logger.handlers = before
