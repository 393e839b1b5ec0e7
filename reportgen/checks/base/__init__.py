"""The records a check declares itself with: :class:`Check` and its :class:`Section` names.

Below every check module and the registry (``reportgen/checks/__init__.py``), so a check can
declare itself without importing the registry that lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from reportgen.results import Role, Row

#: The generic rows template: one table, worst first, passing groups collapsed.
ROWS_TEMPLATE = "sections/rows.html.j2"
#: Roles the pipeline gives rows of any check, so no section lists them: an exception inside the
#: check, a disabled (NOT_RUN) part, a diagnosis the report adds to a failing check.
PIPELINE_ROLES = (Role.EXCEPTION, Role.DISABLED, Role.DIAGNOSIS)
#: Roles of the rows a trained pair of twins gives (reportgen.training.rows): the runs, their held-out
#: metric, accepted and skipped examples, learning curves and the plain-twin cache.
TRAINED_ROLES = (Role.RUN, Role.HELD_OUT, Role.ACCEPTED, Role.SKIPPED, Role.CURVE, Role.CACHE)


@dataclass(frozen=True)
class Section:
    """One name a check writes into the ``check`` column, and how the report shows it.

    Attributes:
        name: the check name, e.g. ``"gradient parity"`` (also what ``verdict.required`` lists).
        intro: the sentence that introduces the section in the report.
        template: the section's template under ``templates/`` (reads only ``section``).
        plotter: ``fn(rows of this check) -> list[reportgen.checks.base.plots.Plot]``, or None.
        required: part of the claim by default (``verdict.required`` when it is null).
        flagged: a separate experiment: every row is FLAGGED and never counts.
        distributed: measured only with ``distributed.world_size > 1``, and then required by
            default (the sharded claim); with one process it has no rows and is not required.
        roles: every :class:`reportgen.results.Role` its rows carry (a value becomes its member; an unknown
            one raises ValueError), besides :data:`PIPELINE_ROLES`
            (which the runner and the report give rows of any check). Each role's
            :class:`reportgen.results.Kind` says what the rows mean: the verifier re-judges the
            ``PARITY`` ones as required (``reportgen.checks.roles_of``), the signed statement repeats
            the ``COST`` ones. Listing every role is checked (tests/checks/test_new_check.py).
    """

    name: str
    intro: str
    template: str = ROWS_TEMPLATE
    plotter: Callable[[pd.DataFrame], list] | None = None
    required: bool = True
    flagged: bool = False
    distributed: bool = False
    roles: tuple[Role, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", tuple(Role(r) for r in self.roles))


@dataclass(frozen=True)
class Check:
    """One check: the function that measures, and the sections (names) its rows go to.

    Attributes:
        run: ``fn(setup) -> list[Row]``; an exception becomes an ERROR row of ``sections[0]``.
        sections: the names it produces, in report order.
        config: the config group whose ``enabled: false`` turns the check off (e.g. ``"memory"``),
            or None (always runs). The runner then writes one NOT_RUN row per section (FLAGGED for
            a flagged experiment) and does not call ``run``.
    """

    run: Callable[..., list[Row]]
    sections: tuple[Section, ...] = field(default_factory=tuple)
    config: str | None = None

    @property
    def name(self) -> str:
        """The first section's name: what the console says while it runs."""
        return self.sections[0].name
