"""The "mocose" model type for transformers' Auto classes, from `import hf_mocose` on, without importing them first.

`import hf_mocose` loads neither torch nor transformers (`hf-mocose mtd` is arithmetic), yet after it
`AutoConfig.from_pretrained`, `AutoModel.from_pretrained` and `SentenceTransformer(...)` load a MoCoSE
checkpoint, whichever is imported first: if transformers' auto modules are loaded, `configuration.py` and
`modeling.py` are imported now (each registers its class when it runs); if not, a finder at the front of
`sys.meta_path` imports ours once an auto module has run and the imports under way have settled, then steps aside.

Why "settled": an auto module can load in the middle of another import. With peft installed,
`transformers.trainer_utils` imports peft, which imports the auto classes; so `from transformers import Trainer`,
or any of our modules that imports `TrainerCallback`, reaches the auto modules while that module (or one of ours)
is half-initialised, and `modeling.py` imported right then re-entered it (`ImportError: cannot import name ...
from partially initialized module`; the first GPU acceptance run's FSDP2 child failed so). So our import waits
until no module of hf_mocose or transformers is initialising: the finder follows the end of each of their
submodules' imports (it finds nothing itself: the import system's own path finder does, and only the loader's
`exec_module` is followed by ours).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

# transformers' auto module -> ours, whose import registers the "mocose" type with it
REGISTERING_MODULES = {
    "transformers.models.auto.configuration_auto": "hf_mocose.models.configuration",  # AutoConfig
    "transformers.models.auto.modeling_auto": "hf_mocose.models.modeling",  # AutoModel (and AutoConfig)
}
WATCHED_PACKAGES = ("hf_mocose.", "transformers.")  # whose half-initialised modules ours may import


def _initialising(name: str, module) -> bool:
    return name.startswith(WATCHED_PACKAGES) and getattr(getattr(module, "__spec__", None), "_initializing", False)


class _RegisterAfterAutoModules(importlib.abc.MetaPathFinder):
    """Finds no module itself; follows the end of each hf_mocose/transformers submodule's import, and imports ours
    once its auto module has run and no such module is still initialising."""

    def __init__(self, pending: dict[str, str]):
        self.pending = dict(pending)  # auto modules not yet imported -> ours
        self.due: list[str] = []  # ours, whose auto module has run

    def find_spec(self, fullname, path, target=None):
        if path is None or not fullname.startswith(WATCHED_PACKAGES):
            return None  # top-level names stay with the finders after us (editable installs' among them)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # None: the import system's other finders take over, as without us
        becomes_due = self.pending.pop(fullname, None)
        run_module = spec.loader.exec_module  # the loader is this module's own: patching it touches nothing else

        def exec_module(module):
            run_module(module)
            if becomes_due:
                self.due.append(becomes_due)
            self.import_due_modules(finishing=fullname)

        spec.loader.exec_module = exec_module
        return spec

    def import_due_modules(self, finishing: str) -> None:
        if not self.due or any(_initialising(name, module) for name, module in list(sys.modules.items())
                               if name != finishing):
            return  # the end of the outermost import under way calls again
        due, self.due = self.due, []
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        for ours in due:
            importlib.import_module(ours)


def register_mocose_with_auto_classes() -> None:
    """Registers now for the auto modules transformers has loaded, and when it loads them for the others."""
    pending = {}
    for auto_module, ours in REGISTERING_MODULES.items():
        if auto_module in sys.modules:
            importlib.import_module(ours)
        else:
            pending[auto_module] = ours
    if pending and not any(isinstance(finder, _RegisterAfterAutoModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterAutoModules(pending))
