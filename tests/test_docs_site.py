"""The documentation site as a reader sees it: `bash scripts/build_docs.sh` builds it (strict mode) and headless
Chromium renders the home page and the API page, screenshots them and dumps their DOM after the scripts ran.

Marker `docs`, left out of the default run (`python -m pytest -q -m docs tests/test_docs_site.py`; .ci/run runs it):
the build needs the `docs` extra, which the script installs where it is missing. Skipped, saying why, only where no
Chromium is found (Debian: `apt-get install -y chromium`, which .ci/run does).
"""

from __future__ import annotations

import html
import inspect
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PUBLIC_API = ("MoCoSETrainer", "MoCoSETrainingArguments", "MoCoSELoss", "MoCoSEModel", "MoCoSEConfig",
              "export_to_sentence_transformers", "push_export")
SCREENSHOTS = Path(os.environ.get("HF_MOCOSE_DOCS_SCREENSHOTS", ROOT / "site-screenshots"))


@pytest.fixture(scope="module")
def chromium() -> str:
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if browser is None:
        pytest.skip(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): `apt-get install -y chromium`")
    return browser


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    build = subprocess.run(["bash", "scripts/build_docs.sh"], cwd=ROOT, env={**os.environ, "SITE_DIR": str(folder)},
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-6000:]
    return folder


def render(chromium: str, page: Path, *flags: str) -> subprocess.CompletedProcess:
    # --allow-file-access-from-files: the pages are opened as files, whose scripts (search) read the site's other files
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
               "--allow-file-access-from-files", "--window-size=1280,1600", "--virtual-time-budget=5000", *flags,
               page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def looked_at(chromium: str, page: Path, name: str) -> tuple[str, float]:
    """The page's DOM text after its scripts ran, and the grey-level standard deviation of its screenshot (a blank or
    unstyled page is near 0), which is kept in SCREENSHOTS for a person to look at."""
    from PIL import Image, ImageStat

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    png = SCREENSHOTS / f"{name}.png"
    render(chromium, page, f"--screenshot={png}")
    spread = ImageStat.Stat(Image.open(png).convert("L")).stddev[0]
    return render(chromium, page, "--dump-dom").stdout, spread


def shown_text(dom: str) -> str:
    """The words of a page's body as a reader sees them: no tags, entities decoded, whitespace runs as one space."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", body)).split())


def test_the_home_page_renders_the_readme(chromium, site):
    assert (site / "index.html").is_file() and (site / "api.html").is_file()
    dom, spread = looked_at(chromium, site / "index.html", "index")
    assert spread > 20, f"site/index.html looks blank (grey-level spread {spread:.1f})"
    text = shown_text(dom)
    for words in ("hf-mocose", "Set up, run and test", "python -m pytest -q", "Quick start: MoCoSETrainer", "79.73 to 83.40"):
        assert words in text, words
    for link in ('href="getting_started.html"', 'href="api.html"', 'href="results.html"'):
        assert link in dom, link
    assert re.search(r'<div class="md-search" data-md-component="search"[^>]*>', dom).group(0).count("hidden") == 0, \
        "the search box is hidden: Material's search did not start"


def test_the_api_page_names_the_public_classes_with_their_docstrings(chromium, site):
    import hf_mocose

    dom, spread = looked_at(chromium, site / "api.html", "api")
    assert spread > 20, f"site/api.html looks blank (grey-level spread {spread:.1f})"
    text = shown_text(dom)
    for name in PUBLIC_API:
        assert f'.{name}"' in dom, f"no heading for {name}"
        if name in hf_mocose.__all__:  # its docstring's first words, as rendered
            words = " ".join(re.sub(r"[`\[\]*~]", "", inspect.getdoc(getattr(hf_mocose, name))).split()[:4])
            assert words in text, (name, words)
    for field in ("queue_size", "ema_decay_start", "head_learning_rate", "learning_rate", "Inherited from"):
        assert field in text, field
    cli = (site / "cli.html").read_text(encoding="utf-8")
    for command in ("hf-mocose train", "hf-mocose export", "hf-mocose push", "hf-mocose evaluate", "--queue_size"):
        assert command in cli, command
