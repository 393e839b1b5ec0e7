"""The report's "Rerun with" command runs verbatim: it never names the folder the run was written to."""

from pathlib import Path

from reportgen.report.metadata import names_output_folder, rerun_command


def test_the_rerun_command_leaves_out_the_output_folder(tmp_path):
    argv = ["m", "+model=ffn", "hydra.run.dir=outputs/first", "report.sign=false", "++hydra.job.name=x"]
    assert rerun_command(argv, {}, tmp_path) == "python -m reportgen +model=ffn report.sign=false"
    sweep = ["m", "-m", "+model=ffn", "hydra.sweep.dir=sw", "hydra.sweep.subdir=a", "seed=1,2"]
    assert rerun_command(sweep, {}, tmp_path) == "python -m reportgen -m +model=ffn seed=1,2"
    job = rerun_command(sweep, {}, Path.cwd(), job_overrides=["+model=ffn", "seed=2", "hydra.run.dir=sw/1"])
    assert job == "python -m reportgen +model=ffn seed=2"


def test_only_output_locations_are_left_out():
    assert all(map(names_output_folder, ["hydra.run.dir=a", "+hydra.sweep.dir=b", "hydra.output_subdir=null"]))
    kept = ["hydra.job.chdir=true", "hydra.searchpath=[file://c]", "hydra/launcher=basic", "hydra.runtime=x", "run.x=1"]
    assert not any(map(names_output_folder, kept))
