"""What the README and the user guide say about the code, checked against the code: the
command's subcommands, which backend an array goes to, what the test matrix costs and how to
run one session, and what a first call does (measuring is off unless turned on)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import polyconv
from polyconv import _backends
from polyconv._cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (ROOT / "docs" / "getting_started.md").read_text(encoding="utf-8")
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def _subcommands() -> list[str]:
    parser = build_parser()
    return [name for action in parser._subparsers._group_actions for name in action.choices]


def test_the_cli_page_counts_and_shows_every_subcommand():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    said = re.search(r"with (\w+)\s+subcommands", text)
    assert said, "docs/cli.md says how many subcommands there are"
    assert NUMBERS[said.group(1)] == len(_subcommands()), (said.group(0), _subcommands())
    for name in _subcommands():
        assert f"## `polyconv {name}`" in text, name


def test_getting_started_sends_torch_tensors_to_the_torch_backend():
    torch = pytest.importorskip("torch")
    section = GETTING_STARTED.split("## Backends", 1)[1].split("\n## ", 1)[0]
    said = re.search(r"PyTorch tensors on `(\w+)`", section)
    assert said, "the Backends section says where PyTorch tensors go"
    x = torch.zeros(1, 4, 4, 2)
    assert _backends.infer_backend("convolution", {"src": x}) == said.group(1)
    generic = re.search(r"anything\s+else(.*?)generic `array_api`", section, re.S)
    assert generic and "PyTorch" not in generic.group(1), generic


def test_readme_says_what_the_test_matrix_costs_and_how_to_run_one_session():
    assert re.search(r"about 30 minutes on 2 CPUs", README)
    assert 'nox -s "tests(numpy)"' in README
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert '"numpy": (' in noxfile    # the session README names exists


@pytest.mark.parametrize("page", ["README.md", "docs/getting_started.md"])
def test_first_calls_are_explained_where_a_user_meets_the_backends(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    first = text[text.index("First calls"):][:1500]
    for needed in ("polyconv.autotune()", "POLYCONV_AUTOTUNE=1", "polyconv.implementation(",
                   "POLYCONV_IMPLEMENTATION"):
        assert needed in first, (page, needed)
    assert not re.search(r"first call measures|measures fastest", text), page


def test_measuring_is_off_by_default_as_the_docs_say(monkeypatch):
    """The docs' claim, against the code: nothing is measured unless asked."""
    from polyconv import _choice

    monkeypatch.delenv("POLYCONV_AUTOTUNE", raising=False)
    assert not _choice.autotune_enabled()
    with polyconv.autotune():
        assert _choice.autotune_enabled()
    monkeypatch.setenv("POLYCONV_AUTOTUNE", "1")
    assert _choice.autotune_enabled()
    x = np.ones((1, 4, 4, 2), np.float32)
    assert polyconv.convolution(x, np.ones((3, 3, 2, 2), np.float32),
                                backend="array_api").shape == (1, 2, 2, 2)


def test_guide_pages_give_their_width_to_the_content():
    """At 1280 px the porting guide's tables and getting started's shape comments were cut
    off beside an empty "Section Navigation" sidebar (checked in headless Chromium at 1280
    and 800 px): the guide's pages have none, and the article may grow past the theme's
    60em."""
    import runpy

    conf = runpy.run_path(str(ROOT / "docs" / "conf.py"))
    guide = sorted(p.stem for p in (ROOT / "docs").glob("*.md") if p.stem != "api")
    assert not [page for page in guide if conf["html_sidebars"].get(page) != []], guide
    assert "polyconv.css" in conf["html_css_files"]
    css = (ROOT / "docs" / "_static" / "polyconv.css").read_text(encoding="utf-8")
    assert re.search(r"\.bd-article-container\s*{\s*max-width:\s*80em", css), css


def test_the_conformance_page_reruns_what_the_record_holds():
    """Each reproduction on the conformance page, parsed by the command line, is the recorded
    case: same op, shapes, attributes, dtype and peer."""
    import shlex

    sys.path.insert(0, str(ROOT / "docs" / "_scripts"))
    import conformance

    from polyconv._cli_args import SHAPE_OPTIONS, attrs_of, op_name

    record = json.loads((ROOT / "docs" / "conformance" / "peers.json").read_text())
    text = conformance.page(record)
    commands = re.findall(r"```bash\n(polyconv compare .*)\n```", text)
    assert commands and len(commands) == text.count("### ")
    cases = {(c["op"], c["dtype"], json.dumps(c["attrs"], sort_keys=True)): c
             for c in record["comparisons"]}
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs_of(args).items()}
        (dtype,) = args.dtypes
        case = cases[(op_name(args.op[0]), dtype, json.dumps(attrs, sort_keys=True))]
        shapes = {r: list(getattr(args, r)) for r in SHAPE_OPTIONS if getattr(args, r, None)}
        assert shapes == {r: s for r, s in case["input_shapes"].items()
                          if r != "bias" and s}, command
        (peer,) = args.peers
        assert any(r["peer"] == peer and r["status"] in ("disagrees", "raises")
                   for r in case["peers"]), command
    for peer in record["peers"]:
        assert f"\n| {peer} | " in text
