"""The documentation site as a reader sees it: `bash scripts/build_docs.sh` builds it (strict mode) and headless
Chromium, started as a reader's browser is (no flag that widens what a page opened from disk may do), opens the built
pages from disk, runs their scripts, measures them and screenshots them at 1280 px and at a phone's 390 px.

Marker `docs`, left out of the default run (`python -m pytest -q -m docs tests/test_docs_site.py`; .ci/run runs it
after installing the `docs` extra, which the build needs). Skipped, saying why, only where no Chromium is found
(Debian: `apt-get install -y chromium`, which .ci/run does). The browser is driven through the DevTools protocol over
a pipe (`--remote-debugging-pipe`), so nothing but Chromium is needed.
"""

from __future__ import annotations

import base64
import fcntl
import html
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PUBLIC_API = ("MoCoSETrainer", "MoCoSETrainingArguments", "MoCoSELoss", "MoCoSEModel", "MoCoSEConfig",
              "export_to_sentence_transformers", "push_export")
SCREENSHOTS = Path(os.environ.get("HF_MOCOSE_DOCS_SCREENSHOTS", ROOT / "site-screenshots"))
# --no-sandbox: Chromium's sandbox cannot start as root in a container; the others keep a headless run quiet. None
# of them changes what a file:// page may load.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--remote-debugging-pipe")


class Browser:
    """Headless Chromium driven through the DevTools protocol on fds 3 and 4 (`--remote-debugging-pipe`)."""

    def __init__(self, executable: str):
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()
        # fds 3 and 4 in the child: moved above them first, so that dup2 cannot overwrite one with the other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]

        def child_fds():
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen([executable, *FLAGS, "about:blank"], pass_fds=(3, 4), preexec_fn=child_fds,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (to_browser, from_browser, *high):
            os.close(fd)
        self._buffer, self._next_id, self.events = b"", 0, []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session=True)

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: bool = False, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str, width: int = 1280, height: int = 900) -> None:
        """Opens `url` in a window `width` px wide (a phone's, touch and all, below 600) and waits for its load."""
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=width < 600)
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + 60
        while not any(event.get("method") == "Page.loadEventFired" for event in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in 60 s")
            self.events.append(self._read())

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.send("Runtime.evaluate", session=True, expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, seconds: float = 15.0):
        """The first truthy value of `expression`, polled in the page; the last value after `seconds`."""
        return self.evaluate(f"""new Promise(resolve => {{
            const start = Date.now();
            (function poll() {{
                const value = ({expression});
                if (value || Date.now() - start > {seconds * 1000}) resolve(value); else setTimeout(poll, 100);
            }})();
        }})""")

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        png = SCREENSHOTS / f"{name}.png"
        png.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", session=True, format="png")["data"]))
        return png

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


@pytest.fixture(scope="module")
def browser():
    executable = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if executable is None:
        pytest.skip(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): `apt-get install -y chromium`")
    opened = Browser(executable)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    build = subprocess.run(["bash", "scripts/build_docs.sh"], cwd=ROOT, env={**os.environ, "SITE_DIR": str(folder)},
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-6000:]
    return folder


def grey_spread(png: Path) -> float:
    """The grey-level standard deviation of a screenshot: a blank or unstyled page is near 0."""
    from PIL import Image, ImageStat

    return ImageStat.Stat(Image.open(png).convert("L")).stddev[0]


def shown_text(browser: Browser) -> str:
    return " ".join(browser.evaluate("document.querySelector('article').innerText").split())


def test_the_home_page_renders_the_readme_and_search_works_from_disk(browser, site):
    browser.open((site / "index.html").as_uri() + "?q=queue")
    results = browser.wait_for("document.querySelectorAll('.md-search-result__item').length")
    assert not browser.evaluate("document.querySelector('[data-md-component=search]').hidden"), \
        "the search box is hidden: Material's search did not start from file://"
    assert results, "a search for 'queue' from file:// returned nothing"
    assert browser.evaluate("document.querySelector('.md-search-result__link').href").startswith("file://")
    browser.open((site / "index.html").as_uri())
    text = shown_text(browser)
    for words in ("hf-mocose", "Set up, run and test", "python -m pytest -q", "Quick start: MoCoSETrainer", "86.72"):
        assert words in text, words
    for link in ("installation.html", "getting_started.html", "api.html", "results.html"):
        assert browser.evaluate(f"!!document.querySelector('article a[href^=\"{link}\"]')"), link
    assert grey_spread(browser.screenshot("index-1280")) > 20, "site/index.html looks blank"


def test_the_readmes_commands_fit_the_page_at_1280_px(browser, site):
    browser.open((site / "index.html").as_uri(), width=1280)
    overflowing = browser.evaluate("""[...document.querySelectorAll('article pre > code')]
        .filter(code => code.scrollWidth > code.clientWidth + 1).map(code => code.innerText.slice(0, 80))""")
    assert overflowing == [], f"code blocks wider than the page at 1280 px: {overflowing}"


def test_wide_tables_and_code_scroll_inside_the_page_on_a_phone(browser, site):
    """At 390 px the page itself does not scroll sideways: a wide table or code block scrolls in its own box."""
    for page in ("index.html", "quality.html", "performance.html", "api.html"):
        browser.open((site / page).as_uri(), width=390, height=844)
        assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), \
            f"{page} scrolls sideways at 390 px"
        browser.screenshot(page.replace(".html", "-390"))


def test_the_api_page_names_the_public_classes_and_shows_no_raw_markup(browser, site):
    import hf_mocose

    browser.open((site / "api.html").as_uri())
    text = shown_text(browser)
    dom = browser.evaluate("document.documentElement.outerHTML")
    for name in PUBLIC_API:
        assert f'.{name}"' in dom, f"no heading for {name}"
        if name in hf_mocose.__all__:  # its docstring's first words, as rendered
            words = " ".join(re.sub(r"[`\[\]*~]", "", inspect.getdoc(getattr(hf_mocose, name))).split()[:4])
            assert words in text, (name, words)
    for field in ("queue_size", "ema_decay_start", "head_learning_rate", "learning_rate", "Inherited from"):
        assert field in text, field
    for raw in ("+====", "+----", "| --- |", ":class:", ":meth:", "``"):
        assert raw not in text, f"raw markup on the API page: {raw!r}"
    assert browser.evaluate("""[...document.querySelectorAll('table')].some(t => /Texts/.test(t.innerText)
        && /Labels/.test(t.innerText))"""), "MoCoSELoss's Inputs table is not rendered as a table"
    assert grey_spread(browser.screenshot("api-1280")) > 20, "site/api.html looks blank"
    cli = (site / "cli.html").read_text(encoding="utf-8")
    for command in ("hf-mocose train", "hf-mocose export", "hf-mocose push", "hf-mocose evaluate", "--queue_size"):
        assert command in cli, command


def test_every_internal_link_and_anchor_resolves(site):
    pages = sorted(site.rglob("*.html"))
    ids = {page: set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8"))) for page in pages}
    broken = []
    for page in pages:
        for href in re.findall(r'<a\b[^>]*\bhref="([^"]+)"', page.read_text(encoding="utf-8")):
            href = html.unescape(href)
            parts = urlsplit(href)
            if parts.scheme or href.startswith("//"):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(site)} -> {href} (no such file)")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in ids.get(target, ()):
                broken.append(f"{page.relative_to(site)} -> {href} (no such anchor)")
    assert not broken, "\n".join(broken[:40])


def test_the_404_page_links_relative_to_the_site(site):
    text = (site / "404.html").read_text(encoding="utf-8")
    assert not re.search(r'\b(href|src)="/(?!/)', text), "404.html has root-absolute links"


def test_search_works_over_http(browser, site):
    """Served (`python -m http.server`), the browser's own Worker runs the search."""
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(site)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = re.search(r"port (\d+)", server.stdout.readline()).group(1)
        browser.open(f"http://127.0.0.1:{port}/index.html?q=queue")
        assert browser.wait_for("document.querySelectorAll('.md-search-result__item').length"), \
            "a search for 'queue' over http returned nothing"
    finally:
        server.kill()
        server.wait()
