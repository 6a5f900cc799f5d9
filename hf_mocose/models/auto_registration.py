"""The "mocose" model type for transformers' Auto classes, from `import hf_mocose` on, without importing them first.

`import hf_mocose` loads neither torch nor transformers (`hf-mocose mtd` is arithmetic), yet after it
`AutoConfig.from_pretrained`, `AutoModel.from_pretrained` and `SentenceTransformer(...)` load a MoCoSE
checkpoint, whichever is imported first: if transformers' auto modules are loaded, `configuration.py` and
`modeling.py` are imported now (each registers its class when it runs); if not, a finder at the front of
`sys.meta_path` imports ours right after each auto module has run, then steps aside. It finds nothing itself:
the import system's own path finder does, and only the loader's `exec_module` is followed by ours.
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


class _RegisterAfterAutoModules(importlib.abc.MetaPathFinder):
    """Finds no module itself; makes the loader of each transformers auto module import ours after it has run."""

    def __init__(self, pending: dict[str, str]):
        self.pending = dict(pending)

    def find_spec(self, fullname, path, target=None):
        if (ours := self.pending.pop(fullname, None)) is None:
            return None
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # None: the import system's other finders take over, as without us
        run_module = spec.loader.exec_module  # the loader is this module's own: patching it touches nothing else

        def exec_module(module):
            run_module(module)
            importlib.import_module(ours)

        spec.loader.exec_module = exec_module
        return spec


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
