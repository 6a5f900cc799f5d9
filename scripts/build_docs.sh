#!/usr/bin/env bash
# Builds the documentation site into site/ in strict mode: a broken link, a missing reference or a docstring that
# does not render fails the build (SITE_DIR=path builds elsewhere). Installs the `docs` extra (setup.cfg) first where MkDocs is missing; run it in
# the virtualenv that has hf-mocose installed (the API and command line pages import it).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import mkdocs, material, mkdocstrings_handlers.python, ruff" 2>/dev/null; then
    python -m pip install -q -e ".[docs]" -c .ci/constraints.txt
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 NO_MKDOCS_2_WARNING=1  # (a banner about MkDocs 2)
python -m mkdocs build --strict --clean --site-dir "${SITE_DIR:-site}"
