"""Imported by the sharded test files before their first launch. Their ranks fork from the fork server
of tests/conftest.py (``FORKSERVER``); this module adds to its preload, once per test worker, the torch
modules every rank imports on its first recomputed forward, FSDP wrap and memory part, instead of each
forked rank importing them again. (Not a conftest.py: a second module named ``conftest`` would hide
tests/conftest.py from the test files' ``from conftest import ...``.)

Measured (2 ranks, gloo, the tiny mlp, this 2-core machine): a forked rank spent 1.9 s of CPU under
DDP and 2.8 s under FSDP2, mostly importing ``torch._dynamo`` (the checkpoint wrapper's first
forward imports it, with sympy), DTensor, FSDP and torch's MemTracker; with them preloaded, 0.35 s
and 1.4 s. The ranks run the same code: only where the import happens moves. Ranks started with
``spawn`` (the product's default, its own tests) still import everything themselves.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing import forkserver

#: What a forked rank imports beyond tests/conftest.py's preload (``sys.modules`` of a rank, diffed).
RANK_MODULES = (
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed._composable.replicate",
    "torch.distributed._tools.fsdp2_mem_tracker",
    "reportgen.memory.tracker",
    "reportgen.twins.prepare",
)

# Appended to the list tests/conftest.py set. The fork server starts at the first sharded launch, after
# collection imported every test module, and reads the list then.
multiprocessing.set_forkserver_preload(
    list(dict.fromkeys([*getattr(forkserver._forkserver, "_preload_modules", []), *RANK_MODULES]))
)
