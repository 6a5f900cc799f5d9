"""The documentation pages generated from the code (scripts/docs_hooks.py), without MkDocs: in the default run, so a
change to a parser or to `MoCoSETrainingArguments` that breaks them fails here too (tests/test_docs_site.py builds
and looks at the whole site, marker `docs`)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/ is a package of the repository root

from scripts import docs_hooks  # noqa: E402


def page(src_uri: str):
    return SimpleNamespace(file=SimpleNamespace(src_uri=src_uri))


def test_the_command_line_page_has_every_sub_command_from_its_parser():
    from hf_mocose.commands.cli import COMMAND_OWNERS

    text = docs_hooks.on_page_markdown("# Command line\n\n<!-- cli-reference -->\n", page("cli.md"))
    titles = re.findall(r"^## `(.+)`$", text, flags=re.M)
    assert titles == ["hf-mocose", *(f"hf-mocose {name}" for name in COMMAND_OWNERS)]
    train = text.split("## `hf-mocose train`")[1].split("## `")[0]
    assert "usage: hf-mocose train RECIPE" in train and "--queue_size" in train and "--ema_decay_start" in train
    wrapped = [line for line in text.splitlines() if len(line) > int(docs_hooks.HELP_COLUMNS)]
    assert len(wrapped) <= 2, wrapped  # argparse wraps at HELP_COLUMNS but for a usage group it cannot break


def test_the_api_page_lists_every_training_argument_with_its_help():
    from hf_mocose import MoCoSETrainingArguments

    text = docs_hooks.on_page_markdown("<!-- training-arguments -->", page("api.md"))
    assert text.startswith("## MoCoSETrainingArguments { #hf_mocose.trainer.training_args.MoCoSETrainingArguments }")
    rows = {row.split(" | ")[0][3:-1]: row for row in text.splitlines() if row.startswith("| `")}
    fields = [field for field in dataclasses.fields(MoCoSETrainingArguments) if field.init]
    assert sorted(rows) == sorted(field.name for field in fields)
    for field in fields:
        help_text = " ".join(field.metadata.get("help", "").split())
        assert docs_hooks.table_cell(help_text[:40]) in rows[field.name], field.name
    assert "{method_settings}" not in text and "Configuration for [`MoCoSETrainer`]" in text


def test_the_home_page_is_the_readme_with_site_links():
    text = docs_hooks.on_page_markdown("", page("index.md"))
    assert text.startswith("# hf-mocose") and "](getting_started.md)" in text and "](changelog.md)" in text
    assert "](docs/" not in text


def test_docstring_cross_references_become_names_linked_where_documented():
    html = ('<h2 id="hf_mocose.models.modeling.MoCoSEModel">MoCoSEModel</h2><p>::</p>'
            "<p>Trains a [<code>MoCoSEModel</code>] like [<code>~transformers.TrainingArguments</code>].</p>")
    out = docs_hooks.on_page_content(html, page("api.md"))
    assert '<a href="#hf_mocose.models.modeling.MoCoSEModel"><code>MoCoSEModel</code></a>' in out
    assert "like <code>TrainingArguments</code>." in out and "<p>::</p>" not in out
    assert docs_hooks.on_page_content(html, page("methods.md")) == html


def test_a_list_after_a_paragraph_line_starts_a_list_as_on_github():
    text = "Against the field:\n- **one**\n- two\n  more\n\n```\nnot a list:\n- kept\n```\n"
    assert docs_hooks.lists_after_paragraphs(text) == text.replace(":\n- **one**", ":\n\n- **one**")


def test_the_build_installs_nothing_and_names_what_is_missing(tmp_path):
    """Without MkDocs (hidden from the path finder, as in a virtualenv without the `docs` extra) the build stops in
    one line naming it and the install command, status 2, and writes no site: it never installs into the caller's
    environment."""
    import os
    import subprocess

    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.machinery as machinery\n"
        "_find = machinery.PathFinder.find_spec.__func__\n"
        "def find_spec(cls, fullname, path=None, target=None):\n"
        "    return None if fullname.partition('.')[0] in {'mkdocs', 'material'} else _find(cls, fullname, path, target)\n"
        "machinery.PathFinder.find_spec = classmethod(find_spec)\n")
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SITE_DIR": str(site)}
    build = subprocess.run(["bash", "scripts/build_docs.sh"], cwd=Path(__file__).resolve().parents[1], env=env,
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 2, build.stdout + build.stderr
    assert build.stderr.startswith("build_docs.sh: ") and build.stderr.count("\n") == 1, build.stderr
    assert "cannot import mkdocs, material" in build.stderr and 'pip install -e ".[docs]"' in build.stderr
    assert not site.exists()
