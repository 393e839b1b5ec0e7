"""The release claim (issue 26): the release note's sentence and its clauses, each judged as a row.

``clauses`` parses ``claim=<name>`` (conf/claim/*.yaml), ``rows`` turns each clause into a row of
the ``release claim`` section from the checks' rows, ``fits`` predicts the step peak a ``fits``
clause bounds. docs/ci.md is the guide.
"""

from reportgen.claim.clauses import (
    Claim,
    ClaimError,
    Clause,
    claim_from_record,
    claim_required,
    parse_claim,
)
from reportgen.claim.rows import claim_table, clause_rows, outcome

__all__ = [
    "Claim",
    "ClaimError",
    "Clause",
    "claim_from_record",
    "claim_required",
    "claim_table",
    "clause_rows",
    "outcome",
    "parse_claim",
]
