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
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.waiting import until

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


# ---- the settings the docs name, and the pages that take a Coral owner to a TPU --------------------------------

SETTING = re.compile(r"EDGETPU_SERVE_[A-Z0-9_]*[A-Z0-9]")
# Variables the docs name that are not settings of app/settings.py or a plug-in's, each with where it is read.
NOT_SETTINGS = {
    "EDGETPU_SERVE_EMULATOR_ACCEL": "read by the emulator itself (app/emulator/accel.py)",
    "EDGETPU_SERVE_BOARD": "docs/backend-plugins.md's example plug-in",
    "EDGETPU_SERVE_THROWAWAY_BOARDS": "docs/backend-plugins.md's example plug-in",
}
CORAL_PAGES = [ROOT / "docs" / name for name in ("devboard.md", "without-docker.md", "deployment.md")]
IMAGE_RECIPES = [ROOT / "Dockerfile", ROOT / "docker" / "devboard.Dockerfile"]


@cache
def setting_names() -> frozenset[str]:
    from app.engines import BACKENDS
    from app.settings import variable_names

    return frozenset(variable_names(BACKENDS.values()))


def shell_blocks(path: Path) -> list[str]:
    """The page's shell code: ```sh/```bash fences and indented blocks, continuation lines kept."""
    text = path.read_text(encoding="utf-8")
    fenced = [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S) if m.group(1) in ("sh", "bash")]
    unfenced = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    indented = [re.sub(r"^    ", "", m.group(1), flags=re.M) for m in re.finditer(r"\n\n((?:    .*\n)+)", unfenced)]
    return fenced + indented


def shell_commands(path: Path) -> list[list[str]]:
    commands = []
    for block in shell_blocks(path):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(shlex.split(line, comments=True))
    return commands


def test_no_page_needs_a_newer_curl_than_the_hosts_have():
    """`curl --output-dir` needs curl 7.73 (Ubuntu 20.04 and Mendel, Debian 10, have older): the docs write `-o PATH`."""
    users = [rel(path) for path in DOCS if "--output-dir" in path.read_text(encoding="utf-8")]
    assert not users, users


def test_every_setting_the_docs_name_is_a_setting():
    named = {(rel(path), m.group(0)) for path in [*DOCS, ROOT / "deploy" / "README.md"]
             for m in SETTING.finditer(path.read_text(encoding="utf-8"))}
    wrong = sorted((page, name) for page, name in named if name not in setting_names() and name not in NOT_SETTINGS)
    assert not wrong, f"the docs name variables the service does not read: {wrong}"


def configuration_rows() -> dict[str, str]:
    """docs/configuration.md: each variable of its tables -> its row."""
    rows = {}
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) >= 3:
            for name in re.findall(r"`([A-Z0-9_]+)`", cells[0]):
                rows[f"EDGETPU_SERVE_{name}"] = line
    return rows


def test_configuration_lists_every_setting_and_what_the_images_set():
    rows = configuration_rows()
    code_only = {"EDGETPU_SERVE_PLUGINS", "EDGETPU_SERVE_EDGETPU_APEX_SYSFS_DIR"}  # in code; an alias of APEX_SYSFS_DIR
    assert set(rows) <= setting_names()
    assert setting_names() - code_only <= set(rows), sorted(setting_names() - code_only - set(rows))
    for recipe in IMAGE_RECIPES:
        instructions = "\n".join(line for line in recipe.read_text().splitlines() if not line.lstrip().startswith("#"))
        for name, value in re.findall(r"(EDGETPU_SERVE_[A-Z0-9_]+)=(\S+?)\s*\\?$", instructions, re.M):
            row = rows[name]
            assert value in row and "image" in row, f"docs/configuration.md's {name} row does not say the images set {value}"
    assert rows["EDGETPU_SERVE_EDGETPU_ON_FAILURE"].startswith("| `EDGETPU_ON_FAILURE` | `fail` (`fallback` in the images)")


@pytest.mark.parametrize("page", CORAL_PAGES, ids=rel)
def test_the_coral_pages_shell_is_well_formed(page):
    """Each shell block parses (bash -n: continuations, quotes, heredocs), every repository path it names exists,
    and every setting a docker run line passes is valid (the service would accept it)."""
    from app.engines import BACKENDS
    from app.settings import Settings

    for block in shell_blocks(page):
        done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert done.returncode == 0, f"{rel(page)}: bash -n refuses:\n{block}\n{done.stderr}"
    for argv in shell_commands(page):
        for word in argv:
            for path in re.findall(r"(?:^|[\s=:])((?:app|docker|tests|deploy|docs|bench|converter)/[\w./-]*\w)", word):
                assert (ROOT / path).exists() or path.startswith("docker/runtime/"), f"{rel(page)}: {path} does not exist"
        if argv[:2] == ["docker", "run"]:
            env = dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "-e")
            assert set(env) <= setting_names(), (rel(page), sorted(set(env) - setting_names()))
            settings = Settings(**{k.removeprefix("EDGETPU_SERVE_").lower(): v for k, v in env.items()
                                   if k.removeprefix("EDGETPU_SERVE_").lower() in Settings.model_fields})
            for plugin in BACKENDS.values():
                settings.plugin_settings(plugin)
            assert argv[-1] in ("edgetpu-serve:latest", "edgetpu-serve:devboard"), argv


def test_the_dev_board_page_goes_from_mendel_to_curl_in_order():
    commands = [" ".join(argv) for argv in shell_commands(ROOT / "docs" / "devboard.md")]
    order = ["mdt devices", "mdt pushkey", "apt-get install -y docker.io", "usermod -aG docker mendel",
             "make images IMAGES=devboard", "docker save edgetpu-serve:devboard", "mkdir -p edgetpu-serve/models",
             "scp -r models/", "cd ~/edgetpu-serve", "docker run", "curl -F image=@"]
    firsts = [next((i for i, c in enumerate(commands) if step in c), None) for step in order]
    assert None not in firsts and firsts == sorted(firsts), list(zip(order, firsts))
    run = next(c for c in commands if c.startswith("docker run"))
    for flag in ("--device /dev/apex_0", "--memory 400m", "EDGETPU_SERVE_MAX_BODY_BYTES_IN_FLIGHT=",
                 "$PWD/models:/models:ro", "stat -c %g /dev/apex_0"):
        assert flag in run, flag
    images = (ROOT / "docs" / "images.md").read_text()
    assert "--memory 400m" in images and "EDGETPU_SERVE_MAX_BODY_BYTES_IN_FLIGHT=67108864" in images  # as recommended


def test_the_pages_pin_what_the_build_pins():
    """The sums and USB IDs the pages make people type are the ones the build and the service check."""
    import tomllib

    from app.edgetpu.usb import BOOTLOADER_ID, RUNTIME_ID

    pins = {f["name"]: f["sha256"] for f in tomllib.loads((ROOT / "app/edgetpu/versions.toml").read_text())["runtime_file"]}
    page = (ROOT / "docs" / "without-docker.md").read_text()
    for digest, name in re.findall(r"([0-9a-f]{64})\s+(\S+\.deb)", page):
        assert pins[name] == digest, name
    for name in re.findall(r"(libedgetpu1-\S+?\.deb)", page):
        assert name in pins, name
    for page in CORAL_PAGES:
        for vendor, product in re.findall(r'idVendor}=="(\w+)",ATTRS{idProduct}=="(\w+)"', page.read_text()):
            assert f"{vendor}:{product}" in (BOOTLOADER_ID, RUNTIME_ID)


def page_command(page: str, start: list[str]) -> list[str]:
    """The one command of a page that starts with these words (variable assignments before them kept)."""
    found = [argv for argv in shell_commands(ROOT / "docs" / page)
             if [w for w in argv if not re.match(r"^[A-Z_]+=", w)][:len(start)] == start]
    assert len(found) == 1, (page, start, found)
    return found[0]


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    words = list(argv)
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def test_the_hardware_tests_command_runs_and_fails_without_a_tpu(tmp_path):
    """deployment.md's command as written (this venv's python for .venv's): the edgetpu tests are collected and
    fail, never skip, here where there is no TPU, with the reason."""
    import os
    import sys

    env, argv = split_env(page_command("deployment.md", [".venv/bin/python", "-m", "pytest"]))
    assert set(env) == {"EDGETPU_TEST_MODEL_DIR"} and argv[3:5] == ["-m", "edgetpu"]
    install = page_command("deployment.md", [".venv/bin/pip", "install"])
    assert install[2:4] == ["-e", "."]  # the service, with the runtime pyproject pins
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_")},
           "EDGETPU_TEST_MODEL_DIR": str(ROOT / "models")}
    done = subprocess.run([sys.executable, *argv[1:], "-p", "no:cacheprovider"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "these tests need a usable Edge TPU: libedgetpu not found" in done.stdout
    assert re.search(r"\b[1-9]\d* (failed|error)", done.stdout) and " skipped" not in done.stdout


def make_serve(env: dict[str, str], port: int) -> subprocess.Popen:
    """The page's `make serve`, with this test's venv (never reinstalled) and port, in its own process group."""
    import os
    import sys

    venv = Path(sys.prefix)
    base = {k: v for k, v in os.environ.items() if not k.startswith("EDGETPU_SERVE_")}
    return subprocess.Popen(["make", "serve", f"VENV={venv}", f"PORT={port}", "-o", f"{venv}/.serve-installed"],
                            cwd=ROOT, env={**base, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_without_docker_page_serves_and_refuses_as_it_says():
    """Its `make serve` lines here, where libedgetpu is not installed: the fallback one serves on the CPU and its
    two `curl`s say why; the TPU-only one stops at start with the reason and the fix."""
    import os
    import signal
    import urllib.request

    from bench.service import free_port

    fallback, strict = [split_env(a) for a in shell_commands(ROOT / "docs" / "without-docker.md")
                        if split_env(a)[1] == ["make", "serve"]]
    env = fallback[0]
    assert env == {"EDGETPU_SERVE_BACKENDS": "edgetpu,cpu", "EDGETPU_SERVE_EDGETPU_ON_FAILURE": "fallback"}
    port = free_port()
    served = make_serve(env, port)
    def ready() -> bool:
        assert served.poll() is None, served.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return True
        except OSError:
            return False

    try:
        until(ready, 120, "make serve ready", poll_s=0.2)
        answers = {}
        for curl in [a for a in shell_commands(ROOT / "docs" / "without-docker.md") if a[:2] == ["curl", "-s"]]:
            url = curl[2].replace("localhost:8000", f"127.0.0.1:{port}")
            done = subprocess.run(["curl", "-s", url], capture_output=True, text=True, timeout=30)
            answers[url.rsplit("/", 1)[-1]] = done.stdout
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        served.wait(30)
    assert set(answers) == {"devices", "readyz"}
    assert '"error":"libedgetpu not found' in answers["devices"]
    assert '"state":"degraded"' in answers["readyz"] and "edgetpu requested, serving on cpu" in answers["readyz"]

    env = strict[0]
    assert env == {"EDGETPU_SERVE_MODELS": "flowers", "EDGETPU_SERVE_BACKENDS": "edgetpu"}
    refused = make_serve({**env, "EDGETPU_SERVE_MODELS": "fashion_mnist"}, free_port())  # a model this checkout has
    out, _ = refused.communicate(timeout=120)
    assert refused.returncode != 0
    (line,) = [line for line in out.splitlines() if line.startswith("edgetpu-serve: cannot start: ")]
    assert "libedgetpu not found" in line and "Fix: " in line
