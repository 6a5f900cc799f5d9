"""Package structure: the folders are layers, and dependencies point one way (docs/design.md has the map).

Each sub-package of `hf_mocose` is one layer; `LAYER_IMPORTS` says which other layers each may import.
The core (every layer but `evaluation` and `commands`) never imports `hf_mocose.evaluation` or the
command line. The CLI's list of command modules names `hf_mocose.evaluation.commands` as a string and
imports it only when the parser is built: dispatch, not a dependency, so it is not an import statement
and the scan allows it. Every import statement counts: lazy ones inside functions and `TYPE_CHECKING`
ones too, so no two modules may import each other even for a type.
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

# layer -> the layers it may import (besides itself). The root `hf_mocose/__init__.py` is the public facade.
LAYER_IMPORTS = {
    "augmentation": set(),
    "data": set(),
    "metrics": set(),
    "models": {"augmentation"},
    "launch": {"models", "augmentation", "data"},
    "publishing": {"models", "augmentation", "data", "launch", "metrics"},
    "trainer": {"models", "augmentation", "data", "launch", "publishing"},
    "st_loss": {"models", "augmentation", "data", "launch", "publishing"},
    "evaluation": {"models", "augmentation", "data", "metrics"},
    "commands": {"models", "augmentation", "data", "launch", "publishing", "trainer", "st_loss", "evaluation"},
    "<root>": {"models", "trainer", "st_loss", "publishing"},
    "compat": set(),  # shims for older library versions: every layer may import it
}
EVERY_LAYER_MAY_IMPORT = {"compat"}
CORE_LAYERS = {"augmentation", "data", "metrics", "models", "launch", "publishing", "trainer", "st_loss", "<root>",
               "compat"}
MAX_ROOT_MODULES = 12
MAX_MODULE_LINES = 400
# The package's line ceiling: raise it by what a feature adds, with one short clause here saying what for; lower it
# after a condensing pass.
MAX_PACKAGE_LINES = 10036
MAX_PACKAGE_MODULES = 54  # besides the __init__.py files


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


def _all_files() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _layer(module: str) -> str:
    """The layer (sub-package) of a module name: `hf_mocose.models.queue` -> `models`; the root package -> `<root>`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE_DIR / parts[1]).is_dir() else "<root>"


def _core_files() -> list[Path]:
    return [p for p in _all_files() if _layer(_module_name(p)) in CORE_LAYERS]


def _module_edges() -> dict[str, set[str]]:
    """Module -> the `hf_mocose` modules its import statements name (a `from pkg import mod` names `pkg.mod`)."""
    modules = {_module_name(p) for p in _all_files()}
    edges = {}
    for path in _all_files():
        module = _module_name(path)
        names = {name if name in modules else name.rpartition(".")[0] for _, name in _imports_of(path)}
        edges[module] = {name for name in names if name in modules and name != module}
    return edges


def test_import_scan_sees_every_form_of_evaluation_import():
    """The scanner itself: each way of importing the evaluation package is caught (else the next test proves nothing)."""
    forms = [
        "from .evaluation.runner import load_encoder",
        "from . import evaluation",
        "from .evaluation import sts",
        "import hf_mocose.evaluation.sts",
        "from hf_mocose.evaluation import encoders",
        "def f():\n    from .evaluation.runner import run_tasks",  # a lazy import counts too
    ]
    for source in forms:
        assert any(_is_evaluation(name) for _, name in _imported_modules(source, "hf_mocose.probe")), source
    assert any(_is_evaluation(n) for _, n in _imported_modules("from ..evaluation import sts", "hf_mocose.metrics.x"))
    clean = "from .encoding import encode_with_model\nfrom .pooling import pool_sentence_embedding"
    assert not any(_is_evaluation(name) for _, name in _imported_modules(clean, "hf_mocose.probe"))


def test_core_modules_never_import_evaluation():
    """No import statement in the core names `hf_mocose.evaluation` or the command line (AST scan)."""
    offenders = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line} imports {name}"
        for path in _core_files()
        for line, name in _imports_of(path)
        if _is_evaluation(name) or name.startswith("hf_mocose.commands")
    ]
    assert len(_core_files()) > 20  # the scan found the package
    assert offenders == [], "the core must not import hf_mocose.evaluation:\n" + "\n".join(offenders)


def test_each_layer_imports_only_the_layers_below_it():
    """Every import statement between sub-packages follows `LAYER_IMPORTS` (e.g. the model never imports a front
    end or publishing; publishing never imports a front end; the two front ends never import each other)."""
    offenders = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line} ({_layer(_module_name(path))}) imports {name} ({_layer(name)})"
        for path in _all_files()
        for line, name in _imports_of(path)
        if name.startswith("hf_mocose") and _layer(name) != _layer(_module_name(path))
        and _layer(name) not in LAYER_IMPORTS[_layer(_module_name(path))] | EVERY_LAYER_MAY_IMPORT
    ]
    assert set(LAYER_IMPORTS) - {"<root>"} == {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()}
    assert offenders == [], "imports against the layer order (docs/design.md):\n" + "\n".join(offenders)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The rule itself: the model importing a front end, or a front end the other, is an offence."""
    assert "trainer" not in LAYER_IMPORTS["models"] and "st_loss" not in LAYER_IMPORTS["trainer"]
    assert "trainer" not in LAYER_IMPORTS["st_loss"] and "publishing" not in LAYER_IMPORTS["launch"]
    names = [name for _, name in _imported_modules("from ..trainer.inputs import x", "hf_mocose.models.modeling")]
    assert _layer(names[0]) == "trainer"


def test_no_import_loop_between_modules():
    """No module reaches itself through import statements (type-only and lazy imports included)."""
    edges = _module_edges()
    loops, state = [], {}

    def visit(module, path):
        state[module] = "open"
        for other in sorted(edges[module]):
            if state.get(other) == "open":
                loops.append(" -> ".join(path[path.index(other):] + [other]))
            elif other not in state:
                visit(other, path + [other])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert sum(len(v) for v in edges.values()) > 100  # the scan found the imports
    assert loops == [], "import loops:\n" + "\n".join(loops)


def test_the_package_root_is_small_and_every_layer_says_what_it_holds():
    """At most 12 modules at the root, each sub-package opens with a docstring naming what it may import, no
    module is over 400 lines, and the package stays within its size (lines, modules)."""
    root_modules = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules
    packages = [p for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()]
    assert len(packages) >= 4
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "May import" in doc, f"{package.name}/__init__.py needs a docstring saying what it may import"
    lines = {str(p.relative_to(PACKAGE_DIR)): len(p.read_text(encoding="utf-8").splitlines()) for p in _all_files()}
    assert {name: n for name, n in lines.items() if n > MAX_MODULE_LINES} == {}
    assert sum(lines.values()) <= MAX_PACKAGE_LINES, f"hf_mocose is {sum(lines.values())} lines"
    assert len([name for name in lines if not name.endswith("__init__.py")]) <= MAX_PACKAGE_MODULES


def test_importing_the_core_loads_no_evaluation_module():
    """Every core module imported in a fresh interpreter leaves `hf_mocose.evaluation` and the command line unloaded."""
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
    assert [m for m in loaded if _is_evaluation(m) or _layer(m) == "commands"] == []


# The method hyper-parameters the one description must cover (each declared in at most 3 files).
CORE_METHOD_SETTINGS = {
    "ema_decay_start", "ema_decay_end", "ema_decay_horizon", "queue_size", "queue_init_size", "fgsm_epsilon",
    "fgsm_mode", "contrastive_temperature", "in_batch_negatives", "head_learning_rate", "head_init",
    "projection_layers", "predictor_layers", "target_dropout",
}
MAX_SETTING_FILES = 3
# Settings whose name is also another thing's: `max_seq_length` is sentence-transformers' word for the inference
# length too, which the export and its command line take under that name.
OTHER_MEANINGS = {"max_seq_length"}


def _declared_names(source: str) -> set[str]:
    """Names `source` declares or passes by name: `name: type = ...` fields, `"name":` dict keys, `name=`
    defaults in a `def`, and `name=...` keywords in a call. Reads (`args.name`, `settings["name"]`) do not count."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Dict):
            found |= {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            positional = node.args.posonlyargs + node.args.args
            found |= {arg.arg for arg in positional[len(positional) - len(node.args.defaults):]}
            found |= {arg.arg for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults) if default is not None}
        elif isinstance(node, ast.Call):
            found |= {keyword.arg for keyword in node.keywords if keyword.arg}
    return found


def test_the_declaration_scan_sees_every_form():
    """The scanner itself: each way of declaring or passing a setting counts, a read does not."""
    for source in ("class A:\n    queue_size: int = 512", "D = {'queue_size': 512}", "def f(queue_size=512): ...",
                   "def f(*, queue_size=512): ...", "f(queue_size=512)", "dict(queue_size=1)"):
        assert "queue_size" in _declared_names(source), source
    for source in ("args.queue_size", "settings['queue_size']", "def f(queue_size): ...", "x = 'queue_size'"):
        assert "queue_size" not in _declared_names(source), source


def test_each_method_setting_is_declared_in_at_most_three_files():
    """Each method hyper-parameter is declared once (`hf_mocose.models.settings`): the model config, the training
    arguments, the loss's keywords and the card's rows are generated from it, so none of them repeats the name."""
    from hf_mocose.models.settings import METHOD_SETTINGS

    names = {setting.name for setting in METHOD_SETTINGS} - OTHER_MEANINGS
    assert CORE_METHOD_SETTINGS <= names
    files: dict[str, list[str]] = {name: [] for name in names}
    for path in _all_files():
        for name in _declared_names(path.read_text(encoding="utf-8")) & names:
            files[name].append(str(path.relative_to(PACKAGE_DIR)))
    assert all(files[name] for name in CORE_METHOD_SETTINGS)  # the scan found the declarations
    spread = {name: paths for name, paths in files.items() if len(paths) > MAX_SETTING_FILES}
    assert spread == {}, f"declared in more than {MAX_SETTING_FILES} files: {spread}"
