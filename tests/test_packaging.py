"""The wheel ships every command: every module of reportgen/ and every shipped config and template is
inside a wheel built from this checkout (packages are found, never listed by hand)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_holds_every_module_config_and_template(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("reportgen-*.whl"))
    shipped = set(zipfile.ZipFile(wheel).namelist())
    modules = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "reportgen").rglob("*.py")
        if "__pycache__" not in p.parts and not p.is_relative_to(ROOT / "reportgen" / "conf")
    }
    configs = {
        "reportgen/" + str(p.relative_to(ROOT))
        for folder in ("conf", "templates")
        for p in (ROOT / folder).rglob("*")
        if p.is_file()
    }
    assert sorted(modules - shipped) == []
    assert sorted(configs - shipped) == []
    assert {
        "reportgen/verify/__main__.py",
        "reportgen/compare/__main__.py",
        "reportgen/sweep/__main__.py",
        "reportgen/conf/examples/hf_causal_lm/config.json",
    } <= shipped
