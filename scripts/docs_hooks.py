"""MkDocs hooks (mkdocs.yml `hooks:`): the documentation pages generated from the code, so they cannot drift from it.

- `docs/index.md` is README.md and `docs/changelog.md` is CHANGELOG.md, their links to `docs/` pages made relative to
  the site;
- `<!-- cli-reference -->` (docs/cli.md) becomes the help of `hf-mocose` and of each sub-command, printed by the
  parsers `hf-mocose` runs (`hf_mocose.commands.cli.build_parser`, and `hf-mocose train`'s recipe parser);
- in the API page, the docstrings' cross-references in transformers' style, [`MoCoSEModel`] or
  [`~transformers.TrainingArguments`], become the name (its last part), linked where the page documents it, and
  the `::` lines of sentence-transformers-style (reStructuredText) literal blocks are dropped;
- `<!-- training-arguments -->` (docs/api.md) becomes `MoCoSETrainingArguments`' section: its docstring's opening
  and the table of its fields, each with its type, default and help. Its method settings are made by
  `make_dataclass` from `hf_mocose.models.settings`, and its docstring is completed at import time, neither of
  which a static reader of the source (mkdocstrings' griffe) sees, so the section reads the class itself;
- on every page, a list right after a paragraph line starts a list, as on GitHub (`lists_after_paragraphs`);
- `404.html`, which MkDocs writes with links from the server's root, gets links relative to the site's folder, so it
  works opened from disk as the other pages do (`relative_404`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import html
import io
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_COLUMNS = "80"  # argparse wraps its help at $COLUMNS: a fixed width, one that fits the page, on every machine
INCLUDED_FILES = {"index.md": "README.md", "changelog.md": "CHANGELOG.md"}


def site_links(markdown: str) -> str:
    """README's and CHANGELOG's links, written for the repository, as the site sees them from its root."""
    markdown = re.sub(r"\]\(docs/", "](", markdown)
    return markdown.replace("](CHANGELOG.md)", "](changelog.md)")


def command_help(run) -> str:
    """What `run()` prints before argparse exits (a `--help`), at a fixed width."""
    out, columns, argv0 = io.StringIO(), os.environ.get("COLUMNS"), sys.argv[0]
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            run()
    finally:
        sys.argv[0] = argv0
        if columns is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue()


def train_help() -> None:
    """`hf-mocose train --help`: the launcher's usage, then the training options (`hf-mocose train RECIPE --help`)."""
    from hf_mocose.commands.launch import USAGE
    from hf_mocose.commands.train import parse_args

    print(USAGE + "\n")
    sys.argv[0] = "hf-mocose train"  # argparse's prog, as `hf-mocose train` sets it
    parse_args(["--help"])


def cli_reference() -> str:
    from hf_mocose.commands.cli import build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    sections = [("hf-mocose", command_help(parser.print_help))]
    for name, subparser in commands.choices.items():
        sections.append((f"hf-mocose {name}", command_help(train_help if name == "train" else subparser.print_help)))
    return "\n".join(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n" for title, text in sections)


def table_cell(value, code: bool = False) -> str:
    """`value` on one line of a Markdown table: HTML, since a `|` escaped with a backslash keeps the backslash in code."""
    text = html.escape(" ".join(str(value).split()), quote=False).replace("|", "&#124;")
    return f"<code>{text}</code>" if code else text


def training_arguments_section() -> str:
    """`MoCoSETrainingArguments`: its docstring's opening (the rest of it lists the fields, which the tables hold), then
    every field with its type, default and help (a method setting's help with what its docstring entry adds)."""
    import inspect

    from transformers import TrainingArguments

    from hf_mocose import MoCoSETrainingArguments
    from hf_mocose.models.settings import ARGS_SETTINGS

    inherited = {field.name: field for field in dataclasses.fields(TrainingArguments)}
    setting_docs = {setting.name: setting.doc for setting in ARGS_SETTINGS}

    def default(field):
        if field.default is not dataclasses.MISSING:
            return field.default
        return field.default_factory() if field.default_factory is not dataclasses.MISSING else None

    def own(field) -> bool:  # MoCoSE's fields, and the Trainer's whose default it changes
        return field.name not in inherited or default(field) != default(inherited[field.name])

    def rows(fields) -> str:
        return "\n".join(f"| `{f.name}` | {table_cell(getattr(f.type, '__name__', f.type), code=True)} "
                         f"| {table_cell(default(f), code=True)} "
                         f"| {table_cell(' '.join((f.metadata.get('help', ''), setting_docs.get(f.name, ''))))} |"
                         for f in fields)

    fields = [field for field in dataclasses.fields(MoCoSETrainingArguments) if field.init]
    opening = inspect.getdoc(MoCoSETrainingArguments).split("\n> ", 1)[0].strip()
    header = "| field | type | default | help |\n| --- | --- | --- | --- |\n"
    return (f"## MoCoSETrainingArguments {{ #hf_mocose.trainer.training_args.MoCoSETrainingArguments }}\n\n"
            f"{opening}\n\n### MoCoSE's fields (and the Trainer's whose default MoCoSE changes)\n\n{header}"
            + rows(f for f in fields if own(f))
            + "\n\n### Inherited from `transformers.TrainingArguments`\n\n" + header
            + rows(f for f in fields if not own(f)) + "\n")


def lists_after_paragraphs(markdown: str) -> str:
    """A blank line before a list that follows a paragraph line: GitHub starts the list there, Python-Markdown would
    run its items into the paragraph (the pages are written for GitHub)."""
    lines, in_code, previous = [], False, ""
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif (not in_code and re.match(r"([-*]|\d+\.) ", line) and previous.strip()
              and not re.match(r"\s|[-*#|]|\d+\. ", previous)):
            lines.append("")
        lines.append(line)
        previous = line
    return "\n".join(lines)


MARKERS = {"<!-- cli-reference -->": cli_reference, "<!-- training-arguments -->": training_arguments_section}


def on_page_markdown(markdown: str, page, **_) -> str:
    if page.file.src_uri in INCLUDED_FILES:
        markdown = site_links((ROOT / INCLUDED_FILES[page.file.src_uri]).read_text(encoding="utf-8"))
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return lists_after_paragraphs(markdown)


def on_page_content(html_text: str, page, **_) -> str:
    if page.file.src_uri != "api.md":
        return html_text
    anchors = {anchor.rsplit(".", 1)[-1]: anchor for anchor in re.findall(r'id="(hf_mocose\.[\w.]+)"', html_text)}

    def name(match: re.Match) -> str:
        short = match.group(1).rsplit(".", 1)[-1]
        code = f"<code>{short}</code>"
        return f'<a href="#{anchors[short]}">{code}</a>' if short in anchors else code

    html_text = html_text.replace("<p>::</p>", "")  # RST's literal-block marker: the indented block is code already
    return re.sub(r"\[<code>~?([\w.]+)</code>\]", name, html_text)


def relative_404(html_text: str) -> str:
    """404.html's root-absolute links (`/api.html`, `/assets/...`) and its base (`"base": "/"`) relative to the site's
    folder, where the page lies."""
    html_text = re.sub(r'\b(href|src)="/(?!/)', r'\1="./', html_text)
    return html_text.replace('"base": "/"', '"base": "."')


def on_post_template(output_content: str, template_name: str, **_) -> str:
    return relative_404(output_content) if template_name == "404.html" else output_content
