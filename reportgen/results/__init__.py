"""Result rows, the one judge, the tidy results frame and the claim verdict. The frame is the single source of
truth: results.csv / results.json are written from it before anything is rendered, and the templates read nothing
else but run metadata. The row contract is :mod:`.row`, the roles :mod:`.role`, the frame, each check's status,
the claim verdict and results.json :mod:`.frame`; their names are importable from here."""

from reportgen.results.frame import (
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    SchemaVersionError,
    baseline_rows,
    check_status,
    check_summary,
    claim_verdict,
    frame_from_json,
    frame_to_json,
    judged_status,
    results_csv,
    to_frame,
)
from reportgen.results.role import Kind, Role
from reportgen.results.row import (
    BASELINE,
    BASELINE_TWINS,
    COLUMNS,
    COMPARATORS,
    SEVERITY,
    TWIN,
    Row,
    Status,
    judge,
    judge_record,
)

__all__ = ["Kind", "Role", "Row", "Status", "judge", "judge_record", "to_frame"]
__all__ += ["READABLE_SCHEMA_VERSIONS", "SCHEMA_VERSION", "SchemaVersionError", "baseline_rows", "check_status"]
__all__ += ["check_summary", "claim_verdict", "frame_from_json", "frame_to_json", "judged_status", "results_csv"]
__all__ += ["BASELINE", "BASELINE_TWINS", "COLUMNS", "COMPARATORS", "SEVERITY", "TWIN"]
