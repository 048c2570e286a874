"""Colour (kronos_audit.cli.output.use_color): `--color=always|never` decides, before or
after the command, as git's `--color`; with `auto`, NO_COLOR (non-empty) turns it off even
on a terminal, FORCE_COLOR (non-empty) turns it on even into a pipe, else a terminal has
colour and anything else is plain."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import KAUDIT, assert_bad_input, on_terminal, run_cli

# A table whose header is bold: an escape wherever there is colour.
INTERVAL = ("interval", "--mtbf", "6h", "--cost", "5min")
ESC = "\x1b["


def coloured(*args: str) -> bool:
    result = run_cli(*args)  # stdout is not a terminal here
    assert result.exit_code == 0, result.output
    assert "checkpoint every" in result.stdout
    return ESC in result.stdout


def test_the_option_then_no_color_then_force_color(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not coloured(*INTERVAL)  # a pipe: plain
    assert coloured("--color=always", *INTERVAL)
    assert coloured(*INTERVAL, "--color", "always")  # after the command, as -q and -v
    assert not coloured("--color=always", *INTERVAL, "--color=never")  # the last one given
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert coloured(*INTERVAL)
    assert coloured("--color=auto", *INTERVAL)
    assert not coloured("--color=never", *INTERVAL)
    monkeypatch.setenv("NO_COLOR", "1")  # over FORCE_COLOR
    assert not coloured("--color=auto", *INTERVAL)
    assert coloured("--color=always", *INTERVAL)  # the option over both
    monkeypatch.setenv("NO_COLOR", "")  # empty: not set
    assert coloured(*INTERVAL)
    monkeypatch.setenv("FORCE_COLOR", "")
    assert not coloured(*INTERVAL)


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_unknown_colour_choice_is_one_line(where: str) -> None:
    args = ("--color=bogus", *INTERVAL) if where == "before" else (*INTERVAL, "--color=bogus")
    assert_bad_input(run_cli(*args), "--color", "auto, always, never", "'bogus'", no_stdout=True)


def test_no_color_on_a_terminal_and_force_color_into_a_pipe() -> None:
    shown = on_terminal(*INTERVAL, env={"NO_COLOR": "1"})
    assert "checkpoint every" in shown
    assert ESC not in shown
    piped = subprocess.run(
        [*KAUDIT, *INTERVAL],
        env={**os.environ, "FORCE_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert ESC in piped.stdout
