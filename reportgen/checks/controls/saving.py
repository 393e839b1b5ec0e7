"""The memory detector control: the recompute twin with its recompute turned off must show no saving of
saved activations, so the memory check's saving threshold must miss it."""

from __future__ import annotations

import functools

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from reportgen.checks.controls.faults import call_directly
from reportgen.checks.controls.rows import SAVING, control_row, stated_row
from reportgen.config import MEMORY, MemoryConfig
from reportgen.memory.saved import saved_activation_bytes
from reportgen.results import Row
from reportgen.twins.setup import Setup


def saving(setup: Setup) -> Row:
    """Control 6: the recompute twin with its recompute turned off must show no saving of saved
    activations, so the memory check's saving threshold (``memory.negligible_saving_share``) must miss it."""
    section: MemoryConfig = setup.config.memory
    if not section.enabled:
        return stated_row(SAVING, MEMORY, "not applicable: memory.enabled=false, there is no memory claim")
    paths = [w.path for w in setup.wrapped]
    measure = functools.partial(
        saved_activation_bytes,
        batch=setup.batch,
        loss_fn=setup.task.loss,
        forward_seed=setup.config.forward_seed,
        module_paths=paths,
    )
    plain = measure(setup.build(False)).total_bytes
    twin = setup.build(True)
    wrappers = [m for m in twin.modules() if isinstance(m, CheckpointWrapper)]
    for wrapper in wrappers:
        wrapper.checkpoint_fn = call_directly
    how = (
        f"the recompute twin with its {len(wrappers)} recompute wrapper(s) calling their modules directly"
        if wrappers
        else "the recompute twin with the model's switch off, which is the plain twin"
    )
    off = measure(twin if wrappers else setup.build(False)).total_bytes
    share = (plain - off) / plain if plain else 0.0
    threshold = section.negligible_saving_share
    said = f"{how} keeps {off} B of saved activations against the plain twin's {plain} B (saving share {share:.3g})"
    if share < threshold:
        return control_row(
            SAVING,
            True,
            MEMORY,
            f"{said}: below memory.negligible_saving_share={threshold:g}, so the memory check states no saving "
            f"(and the peak verdict, memory.min_peak_saving_share={section.min_peak_saving_share:g}, misses too)",
            size="recompute off",
            caught_by="saved activations (total)",
            extra={"saving_share": share},
        )
    why = (
        f"memory.negligible_saving_share={threshold:g} accepts a saving of {share:.3g}, even none: set it above 0"
        if threshold <= 0
        else f"a twin that recomputes nothing saves {share:.3g}: the saved-activation count is wrong for this model"
    )
    return control_row(
        SAVING,
        False,
        MEMORY,
        f"{said}: the memory check is blind to it: {why}",
        size="recompute off",
        extra={"saving_share": share},
    )
