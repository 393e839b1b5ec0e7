"""reportgen's own instruments leave no trace (issue 36, item 6).

The memory tracker, the FLOP counter and the op counter are ``TorchDispatchMode``\\ s. torch.compile
refuses to trace a frame while such a mode is active ("non-infra torch dispatch mode present", torch
2.13), and dynamo then keeps refusing that frame for the rest of the process: a ``fullgraph=True``
function of the user's model would raise in every later check, plain twin included, and be blamed on
the model. :func:`instrument` runs a measurement so that (1) dynamo's caches are reset after it, so the
user's compiled code compiles afresh, exactly as without reportgen's instrument, and (2) a refusal of the
instrument itself is :class:`reportgen.errors.InstrumentRefused`, which the row makes INCONCLUSIVE (the
instrument could not measure), never a FAIL.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from reportgen.errors import INSTRUMENT_REFUSED, InstrumentRefused

#: torch's words when torch.compile refuses a frame under a dispatch mode (torch/_dynamo, 2.13).
REFUSED_UNDER_MODE = ("non-infra torch dispatch mode present", "found no compiled frames")


@contextmanager
def instrument(what: str) -> Iterator[None]:
    """Run the body (one measurement under ``what``, e.g. "the memory tracker") leaving no trace.

    Raises:
        reportgen.errors.InstrumentRefused: the model's compiled code refused to run under the instrument
            (the message names the instrument and quotes torch).
    """
    try:
        yield
    except Exception as exc:
        said = str(exc)
        if any(words in said for words in REFUSED_UNDER_MODE):
            quoted = said.strip().splitlines()[0]
            raise InstrumentRefused(
                f"{what} could not run this model: torch.compile refuses the model's compiled code "
                f"{INSTRUMENT_REFUSED} (a TorchDispatchMode), not because of recompute ({quoted})"
            ) from exc
        raise
    finally:
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:  # compiled code refused under the mode is refused for good unless reset
            dynamo.reset()
