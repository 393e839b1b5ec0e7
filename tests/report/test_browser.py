"""What a person sees (issue 44, item 5): a clean console and the signed report.html in a real browser.

Two signed runs of ``+model=ffn`` through ``python -m reportgen`` in a fresh interpreter (not the
pre-imported fork server, whose imports would hide an import-time warning): one that holds, and one
whose claim clause ``peak_saving_share >= 0.99`` is not met. Neither run nor ``python -m reportgen.verify``
prints a line with "Warning" or "Traceback" (pyhanko's DSA deprecation was printed on every one).

Headless Chromium (``apt-get install chromium``; these tests skip without it) opens each report.html
with name resolution switched off: the page renders (the screenshot is kept in the test's tmp folder),
every link and image in the dumped DOM resolves to an element of the page or a file beside it, none
needs the network, and the verdict text is page 1 of the signed PDF's (``pdftotext``, poppler-utils).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import REPO, SMALL

pytestmark = pytest.mark.slow

#: The small budgets, signed and with a PDF (SMALL turns both off).
SIGNED = [o for o in SMALL if not o.startswith("report.")]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
NOISE = re.compile(r"warning|traceback", re.IGNORECASE)


def _fresh(cwd: Path, module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a new interpreter (every import, and its warnings, happens in it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("PYTHONWARNINGS", None)
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, signing_key_pair):
    """``{"holds": (folder, process), "fails": (folder, process)}``: two signed runs with a PDF."""
    private, _ = signing_key_pair
    made = {}
    for name, extra in (("holds", []), ("fails", ['claim.clauses=["peak_saving_share >= 0.99"]'])):
        cwd = tmp_path_factory.mktemp(name)
        done = _fresh(cwd, "reportgen", "+model=ffn", *SIGNED, f"report.key_path={private}", *extra)
        folders = sorted(p for p in (cwd / "outputs").glob("*/*") if p.is_dir())
        assert len(folders) == 1, done.stdout + done.stderr
        made[name] = (folders[0], done)
    return made


def test_runs_and_verify_print_no_warning_or_traceback(runs, signing_key_pair):
    _, public = signing_key_pair
    assert runs["holds"][1].returncode == 0 and runs["fails"][1].returncode == 1
    for folder, done in runs.values():
        assert not NOISE.search(done.stderr + done.stdout), done.stderr
        verified = _fresh(folder.parent, "reportgen.verify", str(folder), "--key", str(public))
        assert verified.returncode == 0 and "VERIFIED" in verified.stdout
        assert not NOISE.search(verified.stderr + verified.stdout), verified.stderr


class _Links(HTMLParser):
    """Every id, link (href, xlink:href), image or script source and CSS ``url(...)`` of a page."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[str] = []
        self.verdict: list[str] = []
        self._in_verdict = 0

    def handle_starttag(self, tag, attrs):
        named = dict(attrs)
        if named.get("id"):
            self.ids.add(named["id"])
        self.refs += [v for k, v in attrs if k in ("href", "xlink:href", "src", "poster", "data") and v]
        self.refs += re.findall(r"url\(\s*['\"]?([^'\")]+)", named.get("style") or "")
        if tag == "div" and "verdict" in (named.get("class") or "").split():
            self._in_verdict = 1
        elif self._in_verdict:
            self._in_verdict += 1

    def handle_endtag(self, tag):
        if self._in_verdict:
            self._in_verdict -= 1

    def handle_data(self, data):
        if self._in_verdict:
            self.verdict.append(data)


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium with no name resolution (a page that needs the network cannot get it)."""
    offline = ["--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--no-first-run"]
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}", *offline, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _page_one(pdf: Path) -> str:
    """The text of page 1 of ``pdf`` (pdftotext, else pypdf; skips without either)."""
    if shutil.which("pdftotext"):
        done = subprocess.run(["pdftotext", "-f", "1", "-l", "1", "-layout", str(pdf), "-"], capture_output=True)
        return done.stdout.decode()
    pypdf = pytest.importorskip("pypdf", reason="neither pdftotext (poppler-utils) nor pypdf to read the PDF")
    return pypdf.PdfReader(str(pdf)).pages[0].extract_text()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")
@pytest.mark.parametrize("name", ["holds", "fails"])
def test_the_signed_report_renders_offline_with_every_link_resolved_and_page_one_s_verdict(runs, name, tmp_path):
    folder, _ = runs[name]
    page = folder / "report.html"
    shot = tmp_path / f"report-{name}.png"  # kept as the test's artifact
    _chromium("--window-size=1280,1600", "--virtual-time-budget=5000", f"--screenshot={shot}", page.as_uri(),
              profile=tmp_path / "profile")  # fmt: skip
    assert shot.is_file() and shot.stat().st_size > 20_000  # a rendered page, not a blank one
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout
    links = _Links()
    links.feed(dom)
    assert "Claim" in dom and len(links.refs) > 5
    for ref in links.refs:
        assert not re.match(r"(https?|ftp|wss?):", ref, re.IGNORECASE), f"report.html needs the network: {ref}"
        if ref.startswith("#"):
            assert ref[1:] in links.ids, f"report.html links to #{ref[1:]}, which is not on the page"
        elif not ref.startswith(("data:", "mailto:", "javascript:")):
            target = (folder / ref.removeprefix("file://").split("#")[0]).resolve()
            assert target.exists(), f"report.html refers to {ref}, which is not in {folder}"
    verdict = " ".join("".join(links.verdict).split())
    said = {"holds": "Claim HOLDS — PASS", "fails": "Claim FAILS — FAIL"}[name]
    assert verdict == said
    first = [" ".join(line.split()) for line in _page_one(folder / "report.pdf").splitlines()]
    assert verdict in first  # the verdict line of the signed PDF's page 1, word for word
