"""Lines written into a file or a pipe are rich's own rendering of their markup, written
directly; and a name shown is the same whether its directory's part was found before or
is worked out in full. In-process: no command is run."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from rich.console import Console

from kronos_audit.cli import output
from kronos_audit.cli.output import Output

LINES = [
    "",
    "two\nlines",
    "[green]ok[/]   checkpoints/run/step-1.h5.kaudit.json  [dim](run run, step 1)[/]",
    "\\[not markup] and [red]unclosed",
    "  spaces kept  ",
    "a:thumbs_up: code, and a bell\x07 and a return\r removed",
    "[link=https://example.com]a link[/link]",
    "[bold]a tab[/]\tat rich's tab stop",
]


def rich_lines(lines: list[str]) -> str:
    """What rich's console, as kaudit makes it for a pipe, writes for ``lines``."""
    stream = io.StringIO()
    console = Console(
        file=stream,
        force_terminal=False,
        color_system=None,
        no_color=True,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )
    for line in lines:
        console.print(line)
    return stream.getvalue()


class Pipe(io.StringIO):
    """A stream that is not a terminal, counting its flushes."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_a_pipe_gets_riches_text_each_line_flushed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    stream = Pipe()
    monkeypatch.setattr("sys.stdout", stream)
    out = Output()
    with click.Context(click.Command("verify")):
        for i, line in enumerate(LINES[:-1]):
            out.print(line)
            assert stream.flushes >= i + 1  # shown as it happens
        out.print(LINES[-1])  # a tab: rich's own rendering
    assert stream.getvalue() == rich_lines(LINES)
    assert "\t" not in stream.getvalue()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("shown")
    (base / "repo" / ".git").mkdir(parents=True)
    (base / "repo" / "a" / "b" / "c").mkdir(parents=True)
    (base / "other").mkdir()
    os.symlink(base / "repo" / "a", base / "repo" / "link")
    old = os.getcwd()
    yield base
    os.chdir(old)


def test_names_shown_from_a_known_directory_are_the_names_worked_out(tree: Path) -> None:
    names = [
        "x",
        "a",
        "a/b",
        "a/b/c",
        "a/b/c/f.json",
        "a/b/../b",
        "a/",
        "../x",
        "../repo",
        "../../a",
        "..",
        ".",
        "b",
        "f",
        "link/b",
        "link/bb",
        str(tree / "repo" / "a" / "b"),
        str(tree / "other" / "f"),
        str(tree),
    ]
    for cwd in ["repo", "repo/a", "repo/a/b", "repo/a/b/c", "repo/link", "other"]:
        os.chdir(tree / cwd)
        for name in names:
            with click.Context(click.Command("x")):
                full = output._shown(Path(name))
            with click.Context(click.Command("x")):
                # The second time from what the first found of its directory.
                assert [output.shown(name), output.shown(name)] == [full, full], (cwd, name)


def test_a_lines_plain_text_is_riches_wherever_it_is_worked_out_here() -> None:
    """The text written for a line's markup, where kaudit works it out itself (tags
    opened and closed by ``[/]``, escapes), is rich's rendering of it; anything else
    (a close by name, a meta tag, a stray close) is left to rich, which raises for some."""
    from rich.errors import MarkupError
    from rich.markup import render

    pieces = ["[", "]", "\\", "a", "/", "=", "@", "red", " ", "[/]", "[dim]", "\\[", "[/red]"]
    pieces += ["[@click]", "[link=u]", "\x07", "\r", "\t", "\x1b", "é", "[b]x", ":ok:"]
    rng = random.Random(40)
    worked_out = 0
    for _ in range(4000):
        markup = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        text = output._plain_text(markup)
        if text is None:
            continue
        worked_out += 1
        try:
            assert text == render(markup, emoji=False).plain, markup
        except MarkupError:
            pytest.fail(f"rich refuses {markup!r}, which was worked out here")
    assert worked_out > 1000
