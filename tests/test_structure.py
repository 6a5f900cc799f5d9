"""Package structure: dependencies point one way, the core never imports `hf_mocose.evaluation`.

`hf_mocose/evaluation/` (SentEval tasks, diagnostics, their command line) builds on the core;
the core (trainer, model, export, hub, ...) must work without it. The CLI's list of command
modules names `hf_mocose.evaluation.commands` as a string and imports it only when the parser is
built: dispatch, not a dependency, so it is not an import statement and the scan allows it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import hf_mocose

PACKAGE_DIR = Path(hf_mocose.__file__).resolve().parent
EVALUATION_DIR = PACKAGE_DIR / "evaluation"
EVALUATION_PACKAGE = "hf_mocose.evaluation"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """`(line, absolute module name)` of every import statement in `source`, the text of `module`.

    Relative imports are resolved against `module`'s package; `from pkg import name` yields both
    `pkg` and `pkg.name` (the name may be a sub-module).
    """
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _imports_of(path: Path) -> list[tuple[int, str]]:
    return _imported_modules(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")


def _is_evaluation(name: str) -> bool:
    return name == EVALUATION_PACKAGE or name.startswith(EVALUATION_PACKAGE + ".")


def _core_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if EVALUATION_DIR not in p.parents)


def test_import_scan_sees_every_form_of_evaluation_import():
    """The scanner itself: each way of importing the evaluation package is caught (else the next test proves nothing)."""
    forms = [
        "from .evaluation.encoders import load_encoder",
        "from . import evaluation",
        "from .evaluation import sts",
        "import hf_mocose.evaluation.sts",
        "from hf_mocose.evaluation import encoders",
        "def f():\n    from .evaluation.trainer_sts import STSEvaluationMixin",  # a lazy import counts too
    ]
    for source in forms:
        assert any(_is_evaluation(name) for _, name in _imported_modules(source, "hf_mocose.probe")), source
    assert any(_is_evaluation(n) for _, n in _imported_modules("from ..evaluation import sts", "hf_mocose.metrics.x"))
    clean = "from .encoding import encode_with_model\nfrom .pooling import pool_sentence_embedding"
    assert not any(_is_evaluation(name) for _, name in _imported_modules(clean, "hf_mocose.probe"))


def test_core_modules_never_import_evaluation():
    """No import statement outside `hf_mocose/evaluation/` names `hf_mocose.evaluation` (AST scan)."""
    offenders = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line} imports {name}"
        for path in _core_files()
        for line, name in _imports_of(path)
        if _is_evaluation(name)
    ]
    assert len(_core_files()) > 20  # the scan found the package
    assert offenders == [], "the core must not import hf_mocose.evaluation:\n" + "\n".join(offenders)


def test_importing_the_core_loads_no_evaluation_module():
    """Every top-level core module imported in a fresh interpreter leaves `hf_mocose.evaluation` unloaded."""
    modules = sorted(
        _module_name(path) for path in _core_files() if path.name != "__init__.py"
    )
    assert {"hf_mocose.trainer.mocose_trainer", "hf_mocose.publishing.export", "hf_mocose.models.modeling", "hf_mocose.st_loss.loss"} <= set(modules)
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('hf_mocose'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(modules) <= set(loaded)
    assert [m for m in loaded if _is_evaluation(m)] == []


def test_moved_names_are_still_importable_from_evaluation():
    """The old public import paths re-export the core objects themselves (no copies)."""
    from hf_mocose.data import sts_files
    from hf_mocose.evaluation import encoders, sts, trainer_sts
    from hf_mocose.models import encoding
    from hf_mocose.trainer import sts_evaluation as trainer_evaluation

    for name in ("encode_with_model", "encode_batches", "resolve_max_length", "length_sorted_order"):
        assert getattr(encoders, name) is getattr(encoding, name)
    for name in ("StsPairs", "read_sts_benchmark", "read_sts_year_set", "read_sick", "read_lines", "LAYOUT_HELP"):
        assert getattr(sts, name) is getattr(sts_files, name)
    for name in trainer_evaluation.__all__:
        assert getattr(trainer_sts, name) is getattr(trainer_evaluation, name)
