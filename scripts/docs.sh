#!/usr/bin/env bash
# Build the docs site offline from the notebooks, with their saved outputs, into _docs/_build/html.
# Jupyter Book 1.x (Sphinx, myst-nb, sphinx-book-theme) goes into its own .venv-docs: it needs no network at build
# time and none of rlnb's dependencies (nothing is executed). The chapters and their parts: nbs/_toc.yml.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-docs/bin/jupyter-book ] || { python3 -m venv .venv-docs && .venv-docs/bin/pip install -q "jupyter-book>=1,<2"; }
.venv-docs/bin/jupyter-book build nbs --path-output _docs -q
python3 tools/docs_redirects.py _docs/_build/html
echo "the docs: _docs/_build/html/index.html"
