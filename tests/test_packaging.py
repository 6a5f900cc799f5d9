"""An installed (non-editable) wheel carries what the package reads as files, and trains from any folder.

`pytest -m install` runs the tests that build and install the wheel (`.ci/run` runs them again in its floors
virtualenv: `.ci/floors.txt`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.install]
QUICKSTART_PRINTS = ("Saved the final MoCoSE checkpoint to D/final",
                     "Saved the sentence-transformers export (with its model card) to D/sentence-transformers")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel` of the sources git knows (tracked or not ignored), copied out of the checkout first."""
    pytest.importorskip("setuptools", reason="building a wheel without isolation needs setuptools")
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked sources are not known")
    tmp_path = tmp_path_factory.mktemp("wheel")
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                             capture_output=True, check=True).stdout
    source = tmp_path / "src"
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)
    return next((tmp_path / "dist").glob("hf_mocose-*.whl"))


def test_an_installed_wheel_finds_the_card_template_and_the_metric_script(wheel, tmp_path):
    """The wheel, unpacked outside the checkout (what installing a pure-Python wheel does), finds `mocose.md.j2` as
    package data and loads the `evaluate` metric, whose absolute import reaches the installed package."""
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


def test_the_wheel_carries_every_recipe_launcher_config_and_the_slurm_script(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for source, packaged in (("training_args", "recipes"), ("configs/accelerate", "accelerate_configs")):
        files = sorted(path.name for path in (REPO_ROOT / source).glob("*.yaml"))
        assert files and {f"hf_mocose/{packaged}/{name}" for name in files} <= names
    assert "hf_mocose/launch/mocose.sbatch" in names  # `hf-mocose recipes --slurm` prints it


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """`pip install` of the wheel (not editable) into a fresh virtualenv; its python. The virtualenv's own
    site-packages comes first; the libraries come from this interpreter's environment (a `.pth` line: offline, in
    seconds), without that environment's `.pth` files, so without the checkout's editable install."""
    venv = tmp_path_factory.mktemp("install") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    libraries = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    Path(site, "_libraries_of_the_test_environment.pth").write_text("\n".join(libraries) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "-q",
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    return python


@pytest.fixture
def outside(tmp_path) -> tuple[Path, dict[str, str]]:
    """A folder outside the checkout to run in, and the environment to run with."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return tmp_path, {**environment, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_the_installed_requirements_hold(installed):
    """Every requirement of the installed wheel (setup.cfg's install_requires) holds for the versions present: in the
    floors CI (`.ci/floors.txt`) these are setup.cfg's minimum versions."""
    check = ("from importlib.metadata import requires, version\nfrom packaging.requirements import Requirement\n"
             "for line in requires('hf-mocose'):\n    r = Requirement(line)\n"
             "    if not r.marker and not r.specifier.contains(version(r.name), prereleases=True):\n"
             "        print(f'{r.name} {version(r.name)} does not satisfy {r}')\n")
    assert subprocess.run([str(installed), "-c", check], capture_output=True, text=True, check=True).stdout == ""


def test_an_installed_wheel_trains_a_packaged_recipe_from_any_folder(installed, outside):
    """From a folder outside the checkout, `hf-mocose train quickstart --max_steps 3 --output_dir D` trains and
    exports, and `SentenceTransformer` loads the export and encodes (the installed package, not the checkout)."""
    work, env = outside
    hf_mocose = str(installed.parent / "hf-mocose")
    listed = subprocess.run([hf_mocose, "recipes"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    purpose = "Offline quickstart: a few minutes on 2 CPU cores, no Hub access."
    assert re.search(rf"^  quickstart +{re.escape(purpose)}$", listed.stdout, re.M), listed.stdout
    train = subprocess.run([hf_mocose, "train", "quickstart", "--max_steps", "3", "--output_dir", "D"], cwd=work,
                           env=env, capture_output=True, text=True, timeout=900)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-5000:]
    assert all(line in train.stdout.splitlines() for line in QUICKSTART_PRINTS), train.stdout[-3000:]
    encode = ("import hf_mocose, numpy\nfrom sentence_transformers import SentenceTransformer\n"
              "model = SentenceTransformer('D/sentence-transformers')\n"
              "embeddings = model.encode(['A man is playing a guitar.', 'Someone plays music.'])\n"
              "print(hf_mocose.__file__, embeddings.shape, bool(numpy.isfinite(embeddings).all()))\n")
    loaded = subprocess.run([str(installed), "-c", encode], cwd=work, env=env, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    module, result = loaded.stdout.strip().splitlines()[-1].split(" ", 1)
    assert result == "(2, 384) True" and Path(module).is_relative_to(installed.parents[1])  # the installed copy


def test_accelerate_launch_runs_the_installed_module_with_a_recipe_name(installed, outside, tiny_encoder):
    """`accelerate launch [flags] -m hf_mocose.commands.train RECIPE ...` (README, "Using an install"), outside the
    checkout: a packaged recipe by name, one optimizer step of a tiny encoder."""
    work, env = outside
    run = subprocess.run([str(installed), "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines",
                          "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "hf_mocose.commands.train",
                          "quickstart", "--model_name_or_path", tiny_encoder, "--max_steps", "1", "--output_dir", "E",
                          "--export_sentence_transformers", "false"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Saved the final MoCoSE checkpoint to E/final" in run.stdout.splitlines()
    assert (work / "E" / "final" / "config.json").is_file()
