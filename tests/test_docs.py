"""The README and docs/ stay true: links and anchors resolve, named commands exist, the README stays short.

Plain Markdown, no site generator: links are checked here as GitHub renders them. A relative link
must name a file or folder of the repository, and its #anchor a heading of that file (GitHub's
slugs). Every `make TARGET` the docs show must be a rule of the Makefile, and every
`python -m converter SUBCOMMAND` a subcommand of the converter's own argparse parser.
"""

from __future__ import annotations

import argparse
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
README_MAX_LINES = 260
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+(?:-\S+\s+)*(?:[A-Z_]+=\S*\s+)*([a-z][\w.-]*)")
CONVERTER = re.compile(r"python\S*\s+-m\s+converter\s+([a-z][\w-]*)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(prose lines with inline code removed, code: fenced and indented blocks and inline code spans)."""
    prose, code = [], []
    fenced = False
    previous_blank = True
    in_indented = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            previous_blank = False
            continue
        if fenced:
            code.append(line)
            continue
        blank = not line.strip()
        if line.startswith("    ") and (previous_blank or in_indented) and not blank:
            in_indented = True
            code.append(line)
        else:
            in_indented = in_indented and blank
            code.extend(m.group(2) for m in INLINE_CODE.finditer(line))
            prose.append(INLINE_CODE.sub(" ", line))
        previous_blank = blank
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading's anchor in a Markdown file, duplicates numbered as GitHub does (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return frozenset(found)


def links(path: Path) -> list[str]:
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    return [m.group(1) for line in prose for m in LINK.finditer(line)]


def relative_links() -> list[tuple[Path, str]]:
    return [(path, target) for path in DOCS for target in links(path)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)]  # http:, https:, mailto:


def code_of_docs() -> list[tuple[Path, str]]:
    return [(path, line) for path in DOCS for line in split_markdown(path.read_text(encoding="utf-8"))[1]]


def named(pattern: re.Pattern) -> list[tuple[str, str]]:
    """(file, name) for every match of pattern in the docs' code, once each."""
    found = {(rel(path), m.group(1)) for path, line in code_of_docs() for m in pattern.finditer(line)}
    return sorted(found)


@cache
def make_targets() -> frozenset[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_./$()-]+(?:[ \t]+[A-Za-z0-9_./$()-]+)*)[ \t]*:(?![=:])", line)
        if match and not line.startswith("\t"):
            targets.update(t for t in match.group(1).split() if not t.startswith((".", "$")))
    return frozenset(targets)


@cache
def converter_subcommands() -> frozenset[str]:
    from converter.__main__ import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return frozenset(sub.choices)


def test_the_docs_are_found():
    assert README in DOCS and len(DOCS) > 10, [rel(p) for p in DOCS]
    assert relative_links() and named(MAKE) and named(CONVERTER)  # the patterns still match something


def test_the_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/ (at most {README_MAX_LINES})"


def test_the_readme_has_the_sections_a_newcomer_needs_in_order():
    headings = [m.group(2) for m in map(HEADING.match, README.read_text(encoding="utf-8").splitlines())
                if m and len(m.group(1)) == 2]
    wanted = ["Two commands", "Classify a photo", "Your own model on a Coral", "Where to read on"]
    assert [h for h in headings if h in wanted] == wanted


@pytest.mark.parametrize(("path", "target"), relative_links(),
                         ids=[f"{rel(p)}->{t}" for p, t in relative_links()])
def test_every_relative_link_resolves(path, target):
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    assert linked.exists(), f"{rel(path)} links to {target}: {file_part} does not exist"
    assert linked.is_relative_to(ROOT), f"{rel(path)} links outside the repository: {target}"
    if anchor:
        assert linked.suffix == ".md", f"{rel(path)} links to an anchor in a non-Markdown file: {target}"
        assert anchor in anchors(linked), (
            f"{rel(path)} links to {target}: no heading with anchor #{anchor} in {rel(linked)}; "
            f"it has {sorted(anchors(linked))}")


@pytest.mark.parametrize(("path", "target"), named(MAKE))
def test_every_make_target_named_exists(path, target):
    assert target in make_targets(), f"{path} names `make {target}`; the Makefile has {sorted(make_targets())}"


@pytest.mark.parametrize(("path", "subcommand"), named(CONVERTER))
def test_every_converter_subcommand_named_exists(path, subcommand):
    assert subcommand in converter_subcommands(), (
        f"{path} names `python -m converter {subcommand}`; the converter has {sorted(converter_subcommands())}")


def converter_command_lines() -> list[tuple[str, str]]:
    """(file, the arguments after `python -m converter`) of every whole command in the docs' code blocks."""
    found = set()
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S)
        blocks += re.findall(r"(?:^    .*\n)+", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M)
        for block in blocks:
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                match = re.search(r"python\S*\s+-m\s+converter\s+(.*)$", line)
                if match:
                    found.add((rel(path), match.group(1).split(" #")[0].split(" |")[0].strip()))
    return sorted(found)


@pytest.mark.parametrize(("path", "arguments"), converter_command_lines())
def test_every_converter_command_shown_parses(path, arguments):
    """Flags drift too: each command the docs show is accepted by the converter's parser as written."""
    from converter.__main__ import _parser

    try:
        _parser().parse_args(shlex.split(arguments))
    except SystemExit as e:
        raise AssertionError(f"{path}: `python -m converter {arguments}` is refused by the converter") from e


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Your own model on a Coral", "your-own-model-on-a-coral"),
    ("REST API (`/v1`)", "rest-api-v1"),
    ("perf_analyzer against /v2", "perf_analyzer-against-v2"),
    ("10x overload", "10x-overload"),
    ("Design choices, and what they bought", "design-choices-and-what-they-bought"),
    ("build fashion_mnist", "build-fashion_mnist"),
])
def test_anchors_are_made_as_github_makes_them(heading, anchor):
    assert slug(heading) == anchor


def test_the_checks_catch_what_they_are_for(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Same\n\n## Same\n\nSee [x](#same-1), `[not a link](nowhere.md)`.\n\n"
                    "```sh\nmake serve PORT=9000\n[also not](nowhere.md)\n```\n\n"
                    "    EDGETPU_SERVE_X=1 make test-fast\n")
    assert anchors(page) == {"title", "same", "same-1"}
    assert links(page) == ["#same-1"]
    code = split_markdown(page.read_text())[1]
    assert [m.group(1) for line in code for m in MAKE.finditer(line)] == ["serve", "test-fast"]
    assert {"serve", "test", "test-fast"} <= make_targets()
    assert {"quantize", "compile", "inspect", "evaluate", "build"} <= converter_subcommands()


def test_the_your_own_model_section_has_the_steps_its_end_to_end_test_follows():
    """The fast half of tests/test_your_own_model.py (slow): the section still parses into its steps."""
    from tests.test_your_own_model import code_blocks, commands, section_text

    blocks = code_blocks(section_text())
    assert {b.language for b in blocks} == {"python", "sh"}
    steps = [argv for b in blocks if b.language == "sh" for argv in commands(b)]
    kinds = [" ".join(a[:4]) if a[0] == "python" else " ".join(a[:2]) for a in steps]
    assert kinds.count("python -m converter quantize") == 2  # Keras and PyTorch
    quantized = {a[4].rsplit(".", 1)[-1] for a in steps if a[:4] == ["python", "-m", "converter", "quantize"]}
    assert quantized == {"keras", "pt2"}
    order = ["python -m converter quantize", "python -m converter compile", "scp -r", "make serve", "curl -F"]
    assert [k for k in dict.fromkeys(kinds) if k in order] == order


def test_every_setting_has_its_row_in_the_configuration_page():
    """docs/configuration.md names each variable the service reads (without the EDGETPU_SERVE_ prefix): the
    core's settings, and each plug-in's under one of its names. `plugins` is given in code only."""
    from pydantic import AliasChoices

    from app.engines import BACKENDS
    from app.settings import ENV_PREFIX, Settings

    text = (ROOT / "docs" / "configuration.md").read_text()
    documented = {span for _, span in INLINE_CODE.findall(text)}
    missing = [name.upper() for name in Settings.model_fields if name != "plugins" and name.upper() not in documented]
    for plugin in BACKENDS.values():
        cls = plugin.settings_class
        if cls is None:
            continue
        prefix = cls.model_config.get("env_prefix", "").removeprefix(ENV_PREFIX)
        for name, field in cls.model_fields.items():
            alias = field.validation_alias
            names = {f"{prefix}{name.upper()}"} | {c.upper().removeprefix(ENV_PREFIX) for c in (
                alias.choices if isinstance(alias, AliasChoices) else [alias]) if isinstance(c, str)}
            if not names & documented:
                missing.append(sorted(names)[0])
    assert not missing, f"settings without a row in docs/configuration.md: {missing}"
