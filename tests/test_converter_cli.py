"""python -m converter's interface: help with examples, documented exit codes, usage errors."""

import re
import subprocess
import sys

import pytest

import converter.__main__ as cli
from tests.conftest import ROOT

SUBCOMMANDS = ("build", "quantize", "inspect", "compile", "evaluate")


def test_the_module_help_lists_every_subcommand_with_examples_and_the_exit_codes():
    done = subprocess.run([sys.executable, "-m", "converter", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0
    for name in SUBCOMMANDS:
        assert f"python -m converter {name} " in done.stdout  # an example of each
        assert re.search(rf"^\s+{name}\s+\S", done.stdout, re.M)  # and its one-line help
    documented = dict(re.findall(r"^\s+(\d)\s+(\S.*)$", cli.__doc__, re.M))
    assert set(documented) == {str(code) for code in (cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_USAGE,
                                                     cli.EXIT_CPU_OPS, cli.EXIT_NO_COMPILER)}
    assert "CPU" in documented[str(cli.EXIT_CPU_OPS)] and "edgetpu_compiler" in documented[str(cli.EXIT_NO_COMPILER)]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_help_has_an_example(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"example:\n  python -m converter {name} " in out
    subparsers = next(a for a in cli._parser()._actions if a.dest == "command")  # noqa: SLF001
    unexplained = [a.dest for a in subparsers.choices[name]._actions if not a.help]  # noqa: SLF001
    assert unexplained == []


@pytest.mark.parametrize("argv", [
    ["compile", "models/x", "--num-segments", "0"],
    ["evaluate", "models/x"],  # --data is required
    ["build", "resnet"],
    ["nothing"],
])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == cli.EXIT_USAGE
    assert "usage:" in capsys.readouterr().err
