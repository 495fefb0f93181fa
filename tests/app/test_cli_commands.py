"""Every `shaper …` command that docker-compose.yml and the README show is one the CLI has,
with options it accepts: a deployment or a reader copying a line must never meet
"No such command" (as `shaper worker` once did)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

from app.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for raw in block.splitlines():
            line = raw.split(" #")[0].strip()
            line = re.sub(r"^(\.venv/bin/|\$ )", "", line)
            line = re.sub(r"^([A-Z_]+=\S+ )+", "", line)  # environment before the command
            if line.startswith("shaper "):
                lines.append(line)
    return lines


def _compose_commands() -> list[str]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    found = []
    for service in compose["services"].values():
        command = service.get("command")
        if isinstance(command, list) and command and command[0] == "shaper":
            found.append(shlex.join(command))
    return found


def _parses(line: str) -> None:
    args = shlex.split(line)[1:]
    command = typer.main.get_command(cli)
    path = ["shaper"]
    # Typer ships its own click: go by what a group can do, not by its class.
    while hasattr(command, "list_commands") and args and not args[0].startswith("-"):
        name = args.pop(0)
        sub = command.get_command(command.context_class(command), name)
        assert sub is not None, f"{line!r}: no command {' '.join([*path, name])!r}"
        command, path = sub, [*path, name]
    assert path != ["shaper"], f"{line!r}: names no command"
    # Parse (not run) the rest: an unknown option or a missing argument fails here.
    command.make_context(" ".join(path), args)


COMMANDS = sorted(set(_readme_commands() + _compose_commands()))


def test_the_readme_and_compose_show_commands() -> None:
    assert any(c.startswith("shaper worker") for c in COMMANDS)
    assert any(c.startswith("shaper sim ") for c in COMMANDS)


@pytest.mark.parametrize("line", COMMANDS)
def test_each_shown_command_exists(line: str) -> None:
    _parses(line)


def test_a_made_up_command_is_caught() -> None:
    with pytest.raises(AssertionError, match="no command"):
        _parses("shaper frobnicate --now")
    with pytest.raises(Exception, match="No such option"):
        _parses("shaper sim table --no-such-option")
