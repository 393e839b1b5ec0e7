"""The release claim: the release note's sentence and its clauses, each judged as a row (docs/ci.md)."""

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
