"""Library warnings stay off the console (issue 44, item 5): pyhanko's DSA deprecation is filtered by its
category and the module that emits it, nothing broader; any other warning raised while a job runs goes to
the job's log file, not the console. tests/report/test_browser.py runs the real commands in a fresh interpreter."""

from __future__ import annotations

import logging
import warnings

import pytest
from cryptography.utils import CryptographyDeprecationWarning

from reportgen.library_warnings import quiet_known_warnings, warnings_to_log


def _shown(module: str) -> list[str]:
    """The warnings shown when ``module`` emits a CryptographyDeprecationWarning, with the package's filters."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        quiet_known_warnings()
        warnings.warn_explicit("DSA is deprecated", CryptographyDeprecationWarning, "x.py", 20, module=module)
    return [str(w.message) for w in seen]


@pytest.mark.parametrize(
    "module, shown",
    [("pyhanko.sign.signers.pdf_cms", False), ("pyhanko", False), ("pyhankofork", True), ("mine", True)],
)
def test_only_pyhanko_s_dsa_deprecation_is_filtered(module, shown):
    assert bool(_shown(module)) is shown


def test_a_warning_during_a_job_goes_to_its_log_not_the_console(tmp_path, capsys):
    handler = logging.FileHandler(tmp_path / "__main__.log")
    shown = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with warnings_to_log([handler]):
            warnings.warn("a library's advice", UserWarning, stacklevel=1)
        handler.close()
    assert "a library's advice" in (tmp_path / "__main__.log").read_text()
    assert "advice" not in capsys.readouterr().err
    assert warnings.showwarning is shown and logging.getLogger("py.warnings").propagate  # as before the job
    with pytest.warns(UserWarning, match="after the job"):
        warnings.warn("after the job", UserWarning, stacklevel=1)
    assert "after the job" not in (tmp_path / "__main__.log").read_text()
