#!/usr/bin/env bash
# Builds the documentation site into site/ in strict mode: a broken link, a missing reference or a docstring that
# does not render fails the build (SITE_DIR=path builds elsewhere). Run it in the virtualenv that has hf-mocose and its
# `docs` extra (the API and command line pages import the library). It installs nothing: where MkDocs, its plugins or
# the library's own dependencies are missing, it names them and the command that installs them, and stops (status 2),
# so the caller's environment is left as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=$(python - <<'PY'
import importlib.util
needed = {"mkdocs": "docs", "material": "docs", "mkdocstrings_handlers.python": "docs", "ruff": "docs",
          "torch": "core", "transformers": "core", "sentence_transformers": "core"}
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
print(" ".join(name for name in needed if not found(name)))
PY
)
if [ -n "$missing" ]; then
    echo "build_docs.sh: $(command -v python) cannot import ${missing// /, }: install the library with its docs extra" \
         "into this virtualenv first (a checkout: python -m pip install -e \".[docs]\" -c .ci/constraints.txt;" \
         "a wheel: python -m pip install \"hf-mocose[docs]\"), then run this again" >&2
    exit 2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 NO_MKDOCS_2_WARNING=1  # (a banner about MkDocs 2)
python -m mkdocs build --strict --clean --site-dir "${SITE_DIR:-site}"
