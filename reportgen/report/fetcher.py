"""WeasyPrint's URL fetcher for reportgen: the report's own files only, never the network.

The report is self-contained (CSS inlined, plots inline SVG); a URL that reaches the HTML anyway (a model name, an
exception message) must not make the renderer read a file elsewhere or contact a server while a signed report is
made. WeasyPrint leaves a refused resource out and logs a warning, and the report still renders.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from weasyprint.urls import URLFetcher


class RefusedURL(ValueError):
    """A URL outside what the report may read (WeasyPrint skips the resource)."""


class LocalOnlyFetcher(URLFetcher):
    """Serve ``data:`` URLs and ``file:`` URLs under ``roots``; refuse every other URL.

    Args:
        roots: folders whose files the report may embed, e.g. ``templates_dir()`` and the
            run folder. Paths are resolved, so ``..`` and symbolic links cannot leave them.
    """

    def __init__(self, roots: list[str | os.PathLike], **kwargs):
        super().__init__(allowed_protocols=("data", "file"), allow_redirects=False, **kwargs)
        self.roots = [Path(root).resolve() for root in roots]

    def fetch(self, url: str, headers=None):
        """See :class:`weasyprint.urls.URLFetcher`.

        Raises:
            RefusedURL: any URL but ``data:`` or a ``file:`` URL of a file under ``roots``.
        """
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise RefusedURL(f"reportgen does not fetch {url}: a file on another host")
            path = Path(url2pathname(parts.path)).resolve()
            if not any(path.is_relative_to(root) for root in self.roots):
                raise RefusedURL(f"reportgen does not fetch {url}: outside the report's own files")
        elif scheme != "data":
            raise RefusedURL(f"reportgen does not fetch {url}: the report never uses the network")
        return super().fetch(url, headers)
