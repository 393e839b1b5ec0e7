"""The release claim: the release note's sentence and its clauses, each judged as a row (docs/ci.md)."""

from reportgen.claim.clauses import ClaimError, claim_from_record, claim_required, parse_claim
from reportgen.claim.rows import claim_table, clause_rows

__all__ = ["ClaimError", "claim_from_record", "claim_required", "claim_table", "clause_rows", "parse_claim"]
