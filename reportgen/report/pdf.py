"""report.pdf from report.html: WeasyPrint lays the HTML out as PDF/A-3b with the run's files attached.
The only module that lays out with WeasyPrint: the report, the plan and the sweep summary use :func:`write_pdf`."""

from __future__ import annotations

import datetime as dt
import importlib
import io
from collections.abc import Sequence
from pathlib import Path

from reportgen.paths import templates_dir

#: PDF flavour of report.pdf: PDF/A-3b (ISO 19005-3, level B) is archival PDF that may carry
#: attached files (results.json, the signed statement) with a stated relationship.
PDF_VARIANT = "pdf/a-3b"


def renderer_problem() -> str:
    """Why WeasyPrint cannot render here ("" when it can): checked before any model work, so a long run
    never ends in a report it cannot lay out. WeasyPrint loads Pango and its companions with
    ``cffi`` when imported; without them the import raises ``OSError`` naming the missing library."""
    try:
        importlib.import_module("weasyprint")  # the import is the check
    except (OSError, ImportError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, ImportError) and "weasyprint" in str(getattr(exc, "name", "") or first):
            return (
                f"the PDF renderer (WeasyPrint) is not installed ({first}); install reportgen's dependencies "
                "(pip install weasyprint), or run with report.pdf=false for the HTML report alone"
            )
        return (
            f"the PDF renderer (WeasyPrint) cannot load: {first}. Install Pango (Debian/Ubuntu: apt-get install "
            "libpango-1.0-0 libpangoft2-1.0-0; see WeasyPrint's installation docs), or run with report.pdf=false "
            "for the HTML report alone"
        )
    return ""


def write_pdf(
    html: str, created: str, attachments: Sequence[tuple[str, bytes, str, str]] = (), relative_links: bool = False
) -> bytes:
    """Lay out ``html`` with WeasyPrint and return a PDF/A-3b file with ``attachments``.

    The bytes depend only on the arguments (and the installed fonts and WeasyPrint
    version): every date in the file (Info /CreationDate and /ModDate, XMP dates, each
    attachment's /Params dates) is ``created``, the trailer /ID is pydyf's MD5 of the
    objects, and font subset tags are MD5s of font descriptions. So with
    ``SOURCE_DATE_EPOCH`` fixed (which fixes ``created``, see ``metadata.report_time``),
    two renders of the same frame are byte-identical.

    Args:
        html: the rendered report.html.
        created: ISO 8601 time of the run, e.g. ``2024-01-01T00:00:00+00:00``.
        attachments: ``(file name, data, AFRelationship, description)`` per file; the
            relationship is a PDF/A-3 one: ``Data``, ``Source``, ``Supplement``, ...
        relative_links: keep the HTML's relative links relative in the PDF (a sweep summary's
            ``0/report.pdf``), so a signed PDF names no path of the machine that rendered it.

    Returns:
        The PDF file, bytes.

    Raises:
        ValueError: ``created`` is not an ISO 8601 time.
    """
    from weasyprint import HTML, Attachment

    from reportgen.report.fetcher import LocalOnlyFetcher

    when = dt.datetime.fromisoformat(created).astimezone(dt.UTC)
    fetcher = LocalOnlyFetcher([templates_dir()])  # no network, no file outside the report's own
    document = HTML(string=html, base_url=str(templates_dir()), url_fetcher=fetcher).render(pdf_variant=PDF_VARIANT)
    document.metadata.created = document.metadata.modified = when.isoformat()
    if relative_links:  # WeasyPrint resolves them against base_url (the templates folder): undo that
        bases = {Path(templates_dir()).absolute().as_uri() + "/", Path(templates_dir()).resolve().as_uri() + "/"}

        def relative(target):
            return next(
                (target.removeprefix(b) for b in bases if isinstance(target, str) and target.startswith(b)), target
            )

        for page in document.pages:
            page.links = [
                (kind, relative(target) if kind == "external" else target, *rest) for kind, target, *rest in page.links
            ]
    dates = {"created": when, "modified": when}
    files = [
        Attachment(file_obj=io.BytesIO(data), name=name, description=about, relationship=relationship, **dates)
        for name, data, relationship, about in attachments
    ]
    return document.write_pdf(pdf_variant=PDF_VARIANT, attachments=files)
