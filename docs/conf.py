"""Sphinx configuration: MyST pages, numpydoc docstrings, pydata theme.

Before each build this file regenerates, under ``_generated/`` (not in git):
the semantics figures (``_scripts/figures.py``, drawn from polyconv's own geometry), the
``polyconv`` command's help texts (from its argparse parser), the benchmarks page's plots
and tables (from the records in ``records/``) and the conformance page's tables
(``_scripts/conformance.py``, from ``conformance/peers.json``), so none can drift from the code or
the data.
Build with ``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
for path in (ROOT / "backends", ROOT, DOCS / "_scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import polyconv  # noqa: E402

project = "polyconv"
author = "the polyconv developers"
copyright = "the polyconv developers"
version = release = polyconv.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
# the generated Markdown parts are included into pages, not pages of their own
exclude_patterns = ["_build", "_scripts", "_generated/*.md", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

autosummary_generate = True
autodoc_typehints = "none"  # numpydoc sections carry the types
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_validation_checks: set[str] = set()

html_theme = "pydata_sphinx_theme"
html_title = f"polyconv {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
# No left sidebar ("Section Navigation"): the guide's pages have no sub-pages, so it was empty
# and took the width that the porting tables and the code's shape comments need; the
# navigation bar lists every page. The API reference keeps it, for its function pages.
html_sidebars: dict[str, list[str]] = {page.stem: [] for page in DOCS.glob("*.md")
                                       if page.stem != "api"}
html_static_path = ["_static"]
html_css_files = ["polyconv.css"]


def _generate(app) -> None:
    """Figures and CLI help texts, regenerated on every build."""
    import os

    import figures

    from polyconv._cli import build_parser

    os.environ["COLUMNS"] = "90"  # argparse wraps help to the terminal width

    out = DOCS / "_generated"
    figures.main(out)
    parser = build_parser()
    helps = {"polyconv": parser.format_help()}
    for action in parser._subparsers._group_actions:  # the subcommands, in order
        for name, sub in action.choices.items():
            helps[f"polyconv-{name}"] = sub.format_help()
    # `polyconv cases` has one action so far, `export`, whose options are what to show
    cases = parser._subparsers._group_actions[0].choices["cases"]
    helps["polyconv-cases-export"] = cases._subparsers._group_actions[0].choices[
        "export"].format_help()
    # `polyconv bench` passes its arguments on to the suite's own parser
    from polyconv.benchmarks.suite import build_parser as bench_parser

    helps["polyconv-bench"] = bench_parser().format_help()
    for name, text in helps.items():
        target = out / f"{name}.txt"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
    _benchmarks(out)
    import conformance

    conformance.write(DOCS / "conformance" / "peers.json", out / "conformance.md")


def _benchmarks(out: Path) -> None:
    """The benchmarks page's plots and tables, drawn from the committed records
    (``docs/records/<benchmark>-<machine kind>.json``, one per machine kind)."""
    from polyconv.benchmarks.report import docs_pages

    docs_pages(DOCS / "records", out)


def setup(app):
    app.connect("builder-inited", _generate)
