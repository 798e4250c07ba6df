#!/usr/bin/env bash
# Build the docs site offline from the notebooks, with their saved outputs, into _docs/_build/html, and check it.
# Jupyter Book 1.x (Sphinx, myst-nb, sphinx-book-theme) and a copy of MathJax go into their own .venv-docs: nothing
# is executed and rlnb is not imported, so it needs none of rlnb's dependencies, and no network once installed.
#  1. tools/docs_prep.py: nbs/ -> _docs/src, nbdev directives turned into cell tags, one API page per module read
#     from rlnb/*.py (the part "API reference" of nbs/_toc.yml), the `<module>.html.md` pages, llms.txt, MathJax
#  2. jupyter-book builds _docs/src (nbs/_config.yml, nbs/_toc.yml)
#  3. tools/docs_redirects.py: `core.html` -> `10_core.html`, ... (nbdev's page names)
#  4. tools/docs_check.py: every `Docs:` link in rlnb/*.py and llms.txt, every image and local link resolves, and
#     every module has its API page (else the build fails, naming what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if ! { [ -x .venv-docs/bin/jupyter-book ] && .venv-docs/bin/python -c "import mathjax" 2>/dev/null; }; then
  [ -x .venv-docs/bin/python ] || python3 -m venv .venv-docs
  .venv-docs/bin/pip install -q "jupyter-book>=1,<2" "django-static-mathjax==3.2.2.1"
fi
.venv-docs/bin/python tools/docs_prep.py --nbs nbs --pkg rlnb --out _docs/src
.venv-docs/bin/jupyter-book build _docs/src --path-output _docs -q
.venv-docs/bin/python tools/docs_redirects.py _docs/_build/html
.venv-docs/bin/python tools/docs_check.py _docs/_build/html
echo "the docs: _docs/_build/html/index.html (built in $(( $(date +%s) - start )) s)"
