"""Files attached inside a reportgen PDF (PDF/A-3 EmbeddedFiles), read without verifying anything.

The lowest layer: ``reportgen.verify`` checks what it reads here; ``reportgen.compare.derive``
reads a lone report.pdf's results with it.
"""

from __future__ import annotations

import io


class AttachmentError(ValueError):
    """The PDF's attachments are not laid out as reportgen writes them (the message says how)."""


def embedded_files(reader) -> dict[str, bytes]:
    """``{file name: bytes}`` of the attachments in the EmbeddedFiles name tree (flat, as WeasyPrint and sign_pdf
    write it) of the PDF ``reader`` reads (a ``pyhanko.pdf_utils.reader.PdfFileReader``).

    Raises:
        AttachmentError: no attachments, a nested name tree, or a name present twice.
    """
    root = reader.root
    if "/Names" not in root or "/EmbeddedFiles" not in root["/Names"]:
        raise AttachmentError("the PDF has no attached files")
    tree = root["/Names"]["/EmbeddedFiles"]
    if "/Kids" in tree:
        raise AttachmentError("nested EmbeddedFiles name tree (reportgen writes a flat one)")
    names = tree["/Names"]
    files: dict[str, bytes] = {}
    for i in range(0, len(names), 2):
        spec = names[i + 1]
        name = str(spec.get("/UF", spec.get("/F", names[i])))
        if name in files:
            raise AttachmentError(f"attachment {name} appears twice")
        files[name] = spec["/EF"]["/F"].data
    return files


def read_attachments(pdf: bytes) -> dict[str, bytes]:
    """``{file name: bytes}`` of a PDF's attachments (not verified).

    Raises:
        AttachmentError: see :func:`embedded_files`; any unreadable PDF is reported as one too.
    """
    from pyhanko.pdf_utils.reader import PdfFileReader

    try:
        return embedded_files(PdfFileReader(io.BytesIO(pdf), strict=False))
    except AttachmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable PDF is the same answer
        raise AttachmentError(f"not a readable PDF ({type(exc).__name__}: {exc})") from None
