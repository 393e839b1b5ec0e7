"""The lows of issue 44, item 4, each with the value that would be wrong without its fix: control rows tied to the
signed config, a killed run's folder named as unsigned (with the command that runs it again), lazy modules
materialised before the one build is kept, a ``__deepcopy__`` that is no copy caught (the model built per twin, a row
saying why), and ``reportgen.sign``'s seal refusal naming the file that changed."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch
from conftest import REQUIRED, make_key, small_setup, tiny_frame, tiny_meta

from reportgen.checks.controls.rows import FAULTS, stated_row
from reportgen.commands.run import write_results
from reportgen.commands.rundir import LOCK_NAME, FolderLock
from reportgen.report.render import render_report
from reportgen.results import claim_verdict, to_frame
from reportgen.trust.keys import load_public_key, load_signing_key, signature_label
from reportgen.trust.signing import sign_run
from reportgen.twins.observe import observation_rows
from reportgen.verify import verify
from reportgen.verify.outcome import FAIL, PASS

ENABLED = "seed: 0\ncontrols:\n  enabled: true\nreport:\n  sign: true\n"


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory):
    """(private key path, public key)."""
    private, public = make_key(tmp_path_factory.mktemp("keys"))
    return private, load_public_key(public)


def signed(out_dir, private, frame, config: str):
    """A signed run folder (no PDF) whose ``.hydra/config.yaml`` is ``config`` and whose rows are ``frame``."""
    (out_dir / ".hydra").mkdir(parents=True)
    (out_dir / ".hydra" / "config.yaml").write_text(config)
    (out_dir / ".hydra" / "overrides.yaml").write_text("- +model=tiny\n")
    key = load_signing_key(True, str(private))
    meta, verdict = tiny_meta(out_dir, signature_label(key)), claim_verdict(frame, REQUIRED)
    write_results(frame, out_dir)
    render_report(frame, meta, verdict, out_dir, pdf=False, required=REQUIRED)
    sign_run(frame, meta, verdict, out_dir, key, required=REQUIRED)
    return out_dir


def with_controls(*faults: str) -> pd.DataFrame:
    """tiny_frame's rows and an INFO control row of each of ``faults``."""
    rows = to_frame([stated_row(f, "not applicable: the test model has no such region") for f in faults])
    return pd.concat([tiny_frame(), rows], ignore_index=True)


def lines(checks, status):
    return [f"{c.name}: {c.detail}" for c in checks if c.status == status]


def test_a_results_json_re_signed_without_its_control_rows_fails_against_the_signed_config(tmp_path, key_pair):
    private, public = key_pair
    whole = verify(signed(tmp_path / "whole", private, with_controls(*FAULTS), ENABLED), public)
    assert not lines(whole, FAIL) and any(line.startswith("detector controls: ") for line in lines(whole, PASS))
    deleted = verify(signed(tmp_path / "deleted", private, tiny_frame(), ENABLED), public)  # every control row gone
    (line,) = lines(deleted, FAIL)
    assert line.startswith("detector controls: the signed .hydra/config.yaml says controls.enabled: true") and all(
        repr(f) in line for f in FAULTS
    ), line
    one_gone = [f for f in FAULTS][1:]
    (line,) = lines(verify(signed(tmp_path / "one", private, with_controls(*one_gone), ENABLED), public), FAIL)
    assert line.endswith(f"has no row of the control(s) {next(iter(FAULTS))!r}"), line
    off = ENABLED.replace("enabled: true", "enabled: false")
    assert not lines(verify(signed(tmp_path / "off", private, tiny_frame(), off), public), FAIL)


def refusal(folder, capsys) -> str:
    with pytest.raises(SystemExit) as refused:
        FolderLock(folder)
    assert refused.value.code == 2
    return capsys.readouterr().out


def test_a_killed_runs_folder_is_named_unsigned_with_the_command_that_runs_it_again(tmp_path, capsys):
    killed = tmp_path / "killed"
    (killed / ".hydra").mkdir(parents=True)
    (killed / ".hydra" / "overrides.yaml").write_text("- +model=ffn\n- budget.seeds=[0, 1]\n")
    (killed / "results.partial.json").write_text("[]")
    (killed / LOCK_NAME).write_text(f"{os.getpid()}\n")  # left by a SIGKILL: no process holds its flock
    said = refusal(killed, capsys)
    assert "stays as it was signed" not in said and "nothing in it is signed" in said, said
    assert (
        "it was stopped before it finished" in said and "python -m reportgen +model=ffn 'budget.seeds=[0, 1]'" in said
    )
    (killed / "results.partial.json").unlink()
    (killed / "report.pending.json").write_text("{}")
    assert f"not signed yet; sign it with `python -m reportgen.sign {killed.absolute()}`" in refusal(killed, capsys)
    (killed / "statement.dsse.json").write_text("{}")
    assert "so that run stays as it was signed." in refusal(killed, capsys)


def test_a_lazy_module_is_materialised_with_the_fixed_batch_before_the_one_build_is_kept():
    """torch.nn.LazyLinear made exit 70: its weight had no shape when the one build was copied."""
    setup = small_setup("+model=ffn", "model._target_=user_models.copies.lazy")
    first = setup.template.module[0]
    assert type(first) is torch.nn.Linear and first.weight.shape == (12, 12) and not setup.template.rebuilt_because
    plain, recompute = setup.twin(False), setup.twin(True)
    assert torch.equal(plain.model[0].weight.cpu(), first.weight) and plain.model is not recompute.model
    again = small_setup("+model=ffn", "model._target_=user_models.copies.lazy").template.module[0]
    assert torch.equal(again.weight, first.weight)  # the dry forward is part of the seeded build
    loss = plain.step(setup.batch, 0, accept=False, rng=False).loss
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "factory, because",
    [
        ("self_copy", "copy.deepcopy returns the model itself (its __deepcopy__ returns self)"),
        ("fresh_copy", "copy.deepcopy returns a model whose 0.net.0.weight differs from the build's"),
    ],
)
def test_a_deepcopy_that_is_no_copy_builds_the_model_per_twin_and_says_why(factory, because):
    setup = small_setup("+model=ffn", f"model._target_=user_models.copies.{factory}")
    assert because in setup.template.rebuilt_because
    plain, again = setup.twin(False), setup.twin(False)
    assert plain.model is not setup.template.module and plain.model is not again.model
    assert torch.equal(plain.model[0].net[0].weight.cpu(), setup.template.module[0].net[0].weight)
    (row,) = [r for r in observation_rows(setup) if r.metric == "factory_builds_per_twin"]
    assert because in row.detail


def test_the_seal_refusal_names_the_file_that_changed(tmp_path, key_pair, capsys):
    from reportgen.commands import sign
    from reportgen.trust.keys import load_private_key
    from reportgen.trust.manifest import mark_pending, start_manifest

    private, _ = key_pair
    out = tmp_path / "run"
    (out / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        (out / ".hydra" / name).write_text("{}\n")
    start_manifest(out)
    write_results(tiny_frame(), out)
    mark_pending(out, tiny_meta(out), REQUIRED, pdf=False, sign=True, private_key=load_private_key(private))
    (out / ".hydra" / "overrides.yaml").write_text("- parity.rtol=1\n")  # not results.json
    assert sign.main([str(out), "--key", str(private)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert ".hydra/overrides.yaml changed after the checks finished" in line and "results.json" not in line, line
    assert not (out / "statement.dsse.json").exists()
