"""The version floors: `.ci/floors.txt` installs exactly what setup.cfg declares, and the shims (`hf_mocose.compat`)
behave as the newer libraries' own functions (`.ci/run` runs the floors' subset of the suite on the old ones)."""

from __future__ import annotations

import configparser
import logging

import huggingface_hub
from conftest import REPO_ROOT
from packaging.requirements import Requirement
from packaging.version import Version

from hf_mocose import compat

FLOORED = {"transformers", "sentence-transformers", "accelerate", "datasets", "huggingface-hub", "evaluate"}


def _name(requirement: Requirement) -> str:
    return requirement.name.lower().replace("_", "-")


def test_the_floors_ci_installs_setup_cfg_s_minimum_versions():
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    declared = {_name(r): r for r in map(Requirement, config["options"]["install_requires"].split("\n")[1:])}
    lines = (REPO_ROOT / ".ci" / "floors.txt").read_text().splitlines()
    pinned = {_name(r): r for r in map(Requirement, (line for line in lines if line and not line.startswith("#")))}
    assert set(pinned) == FLOORED
    for name, pin in pinned.items():
        (floor,), (exact,) = declared[name].specifier, pin.specifier
        assert (floor.operator, exact.operator, Version(floor.version)) == (">=", "==", Version(exact.version)), name


def test_the_checkpoint_order_of_the_shim_is_transformers_order(tmp_path):
    for name in ("checkpoint-10", "checkpoint-9", "checkpoint-100", "checkpoint-4.bak", "other", "checkpoint-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-7").write_text("a file, not a checkpoint")
    expected = [str(tmp_path / f"checkpoint-{n}") for n in ("4.bak", "9", "10", "100")]
    assert compat._sort_checkpoints(str(tmp_path)) == expected
    assert compat.sort_checkpoints(str(tmp_path)) == expected  # transformers' own where it has one


def test_offline_mode_is_read_when_asked(monkeypatch):
    from huggingface_hub import constants

    for offline in (True, False):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        assert compat.hub_offline() is offline


def test_a_hub_without_eval_result_entries_writes_no_files_and_says_so(tmp_path, monkeypatch, caplog):
    """huggingface_hub < 1.4 (the floor beside transformers 4.x) has no `EvalResultEntry`: the export goes on without
    `.eval_results/`, in one warning."""
    from hf_mocose.publishing.eval_results import write_eval_results
    monkeypatch.setattr(compat, "EvalResultEntry", None)
    results = {"sts": {"sts12": {"spearman_all": 72.04}}}
    with caplog.at_level(logging.WARNING):
        assert write_eval_results(tmp_path, results) == []
    assert not (tmp_path / ".eval_results").exists()
    assert [r.getMessage() for r in caplog.records if "EvalResultEntry" in r.getMessage()] == [
        f"huggingface_hub {huggingface_hub.__version__} has no EvalResultEntry (1.4 added it): no .eval_results files; "
        "the card's model-index has the scores."]
