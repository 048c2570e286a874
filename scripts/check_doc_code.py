"""Check the Python code blocks of the Markdown docs as the code is checked.

Every fenced block whose info string is ``python`` (or ``py``) in README.md and docs/**/*.md
must compile and be formatted as ``ruff format`` formats the package (the project's own
ruff settings, read from pyproject.toml). A block that is deliberately a fragment (an
excerpt that cannot stand alone) says so on its first line, ``# fragment``, and is skipped.

Run: python scripts/check_doc_code.py [--fix] [FILE.md ...]
Exit 0 when every block passes, 1 when one does not (each named by file and line, with
a diff), 2 when a file cannot be read, a fence is never closed or ruff cannot run. --fix
rewrites the blocks ruff would reformat, in place (blocks that do not compile are left for
a person).
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
PYTHON = frozenset({"python", "py", "python3"})
FRAGMENT = re.compile(r"#\s*fragment\b")


class UnclosedFence(Exception):
    """A fence opened and never closed: the rest of the file would be read as code."""


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a Markdown file."""

    path: Path
    """The Markdown file."""
    line: int
    """1-based line of the block's first code line (just after the opening fence)."""
    indent: str
    """The opening fence's indentation, taken off every code line (blocks in lists)."""
    code: str
    """The block's text, dedented, ending in a newline unless it is empty."""

    @property
    def end(self) -> int:
        """1-based line of the closing fence."""
        return self.line + self.code.count("\n")

    @property
    def where(self) -> str:
        """``file:line`` as messages name the block (the file relative to the current
        directory when inside it)."""
        try:
            name = self.path.resolve().relative_to(Path.cwd())
        except ValueError:
            name = self.path
        return f"{name}:{self.line}"

    @property
    def fragment(self) -> bool:
        """Marked as a deliberate fragment on its first line."""
        return FRAGMENT.match(self.code.split("\n", 1)[0].strip()) is not None


def python_blocks(path: Path) -> list[Block]:
    """The file's fenced Python blocks, in order (CommonMark fences: ``` or ~~~, closed by
    a fence of the same character at least as long)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and closing.match(lines[j]) is None:
            j += 1
        if j == len(lines):
            raise UnclosedFence(f"{path}:{i + 1}: the fence opened here is never closed")
        info = opening["info"].strip().split(maxsplit=1)
        if info and info[0].lower() in PYTHON:
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
            blocks.append(Block(path, i + 2, indent, "".join(f"{ln}\n" for ln in body)))
        i = j + 1
    return blocks


def compile_error(block: Block) -> str | None:
    """Why the block does not compile, or None."""
    try:
        compile(block.code, block.where, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{block.where}: line {exc.lineno or 1} of the block does not compile: {exc.msg}"
    return None


def ruff_format(code: str) -> str:
    """The code as ``ruff format`` writes it, with the project's settings."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", "doc_block.py", "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ruff format failed: {done.stderr.strip()}")
    return done.stdout


def rewrite(path: Path, fixes: dict[int, tuple[Block, str]]) -> None:
    """Put formatted code in place of the blocks starting at the given lines."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for start in sorted(fixes, reverse=True):
        block, code = fixes[start]
        new = [f"{block.indent}{ln}" if ln else ln for ln in code.rstrip("\n").split("\n")]
        lines[block.line - 1 : block.end - 1] = new
    path.write_text("\n".join(lines), encoding="utf-8")


def check(paths: list[Path], *, fix: bool) -> int:
    """Report every failing block on stdout; the number of failures left."""
    failures = checked = fragments = 0
    for path in paths:
        fixes: dict[int, tuple[Block, str]] = {}
        for block in python_blocks(path):
            if block.fragment:
                fragments += 1
                continue
            checked += 1
            if (error := compile_error(block)) is not None:
                print(error)
                failures += 1
                continue
            formatted = ruff_format(block.code)
            if formatted == block.code:
                continue
            where = block.where
            if fix:
                fixes[block.line] = (block, formatted)
                print(f"{where}: reformatted")
                continue
            print(f"{where}: not formatted as ruff format would:")
            diff = difflib.unified_diff(
                block.code.splitlines(keepends=True),
                formatted.splitlines(keepends=True),
                f"{where} (as written)",
                f"{where} (ruff format)",
            )
            sys.stdout.writelines(diff)
            failures += 1
        if fixes:
            rewrite(path, fixes)
    print(
        f"{checked} python block(s) checked, {fragments} fragment(s) skipped, {failures} failing",
        file=sys.stderr,
    )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("files", nargs="*", type=Path, help="default: README.md docs/*.md")
    parser.add_argument("--fix", action="store_true", help="rewrite unformatted blocks")
    args = parser.parse_args(argv)
    files: list[Path] = args.files or [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    try:
        failures = check(files, fix=args.fix)
    except (OSError, UnicodeDecodeError, UnclosedFence, RuntimeError) as exc:
        print(f"check_doc_code: {exc}", file=sys.stderr)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
