"""An installed (non-editable) wheel carries what the package reads as files: the card template and the metric."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT


@pytest.mark.slow
def test_an_installed_wheel_finds_the_card_template_and_the_metric_script(tmp_path):
    """`pip wheel` of the sources git knows (tracked or not ignored); the wheel, unpacked outside the checkout
    (what installing a pure-Python wheel does), finds `mocose.md.j2` as package data and loads the `evaluate`
    metric, whose absolute import reaches the installed package."""
    pytest.importorskip("setuptools", reason="building a wheel without isolation needs setuptools")
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked sources are not known")
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                             capture_output=True, check=True).stdout
    source = tmp_path / "src"
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "wheel")], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "wheel").glob("hf_mocose-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "hf_mocose/templates/mocose.md.j2" in names and "hf_mocose/metrics/sts_correlation.py" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    script = (
        "import hf_mocose, pathlib\n"
        "from hf_mocose.publishing.model_card import find_template\n"
        "from hf_mocose.metrics import load_sts_correlation\n"
        "print(pathlib.Path(hf_mocose.__file__).parent)\n"
        "print(find_template())\n"
        "print(load_sts_correlation().compute(predictions=[0.1, 0.2, 0.3], references=[1.0, 2.0, 3.0])['spearman'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    package, template, spearman = result.stdout.strip().splitlines()[-3:]
    assert Path(package) == tmp_path / "site" / "hf_mocose"  # the installed copy, not the checkout
    assert Path(template) == tmp_path / "site" / "hf_mocose" / "templates" / "mocose.md.j2"
    assert float(spearman) == pytest.approx(100.0)
