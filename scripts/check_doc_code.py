"""Check the Python code blocks of the Markdown docs as the code is checked.

Every fenced block whose info string is ``python`` (or ``py``) in README.md and docs/**/*.md
must compile, import what it imports, and be formatted as ``ruff format`` formats the
package (the project's own ruff settings, read from pyproject.toml). A block that is
deliberately a fragment (an excerpt that cannot stand alone) says so on its first line,
``# fragment``, and is skipped.

Imports are checked by running them, in a fresh interpreter of this environment: each import
statement of kronos_audit or of the standard library, and each ``ka.Name`` a block takes
from ``import kronos_audit as ka``, so a page that names a module or a function that moved
fails here, not in a reader's hands. A third-party import (torch, mpi4py, transformers) is
only looked up (its top-level module must be installed): running those would cost tens of
seconds and start MPI, and their names are their projects' to keep.

Run: python scripts/check_doc_code.py [--fix] [FILE.md ...]
Exit 0 when every block passes, 1 when one does not (each named by file and line, with
a diff), 2 when a file cannot be read, a fence is never closed or ruff cannot run. --fix
rewrites the blocks ruff would reformat, in place (blocks that do not compile are left for
a person).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
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


PROJECT = "kronos_audit"

# Run in a fresh interpreter (-I: nothing from the current directory or PYTHONPATH shadows
# the installed package): reads the checks as JSON on stdin, writes one reason or null each,
# on its last line.
IMPORT_RUNNER = r"""
import importlib, importlib.util, json, re, sys
def why(exc):
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    text = re.sub(r" \((unknown location|/[^)]*)\)$", "", text)  # the file it looked in
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
out = []
for block in json.load(sys.stdin):
    space = {}
    for kind, a, b in block:
        try:
            if kind == "run":
                exec(a, space)
                out.append(None)
            elif kind == "find":
                found = importlib.util.find_spec(a) is not None
                out.append(None if found else f"no module named {a!r} is installed")
            elif a not in space:
                out.append(None)  # its import failed, and said so
            elif hasattr(space[a], b):
                out.append(None)
            else:
                module = space[a].__name__
                try:
                    importlib.import_module(f"{module}.{b}")
                    out.append(None)
                except ImportError:
                    out.append(f"module {module!r} has no attribute {b!r}")
        except Exception as exc:
            out.append(why(exc))
print(json.dumps(out))
"""


def import_checks(block: Block) -> list[tuple[int, list[str]]]:
    """What to check of the block's imports, in its order: ``(line in the block, [kind, a,
    b])``, kind ``run`` (run the statement ``a``), ``find`` (the module ``a`` is installed)
    or ``attribute`` (the module bound to ``a`` has ``b``). The block compiles."""
    tree = ast.parse(block.code)
    checks: list[tuple[int, list[str]]] = []
    project_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.partition(".")[0] for alias in node.names]
            for alias in node.names:
                if alias.name == PROJECT:
                    project_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots = [node.module.partition(".")[0]]
        else:
            continue
        for root in dict.fromkeys(roots):
            if root == PROJECT or root in sys.stdlib_module_names:
                continue
            checks.append((node.lineno, ["find", root, ""]))
        if all(r == PROJECT or r in sys.stdlib_module_names for r in roots):
            checks.append((node.lineno, ["run", ast.unparse(node), ""]))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in project_names
        ):
            checks.append((node.lineno, ["attribute", node.value.id, node.attr]))
    # ast.walk is breadth first: imports run in the order of their lines, before any use
    order = {"find": 0, "run": 0, "attribute": 1}
    checks.sort(key=lambda c: (order[c[1][0]], c[0]))
    unique = dict.fromkeys((line, tuple(c)) for line, c in checks)  # ka.Run used twice
    return [(line, list(c)) for line, c in unique]


def import_errors(blocks: list[Block]) -> list[tuple[Block, str]]:
    """Each import of the blocks that fails, with its block and one line naming the block
    and its line; run in one fresh interpreter for all of them."""
    checks = [import_checks(block) for block in blocks]
    if not any(checks):
        return []
    # -I ignores PYTHONPYCACHEPREFIX too: the cache this process reads and writes (as under
    # scripts/test.sh) is named, or the runner compiles anew what it imports.
    cache = ["-X", f"pycache_prefix={sys.pycache_prefix}"] if sys.pycache_prefix else []
    done = subprocess.run(
        [sys.executable, "-I", *cache, "-c", IMPORT_RUNNER],
        input=json.dumps([[c for _, c in block] for block in checks]),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the imports could not be checked: {last}")
    # the last line: what an imported module prints comes before it
    reasons = iter(json.loads(done.stdout.rpartition("\n")[0].rpartition("\n")[2]))
    errors: list[tuple[Block, str]] = []
    for block, block_checks in zip(blocks, checks, strict=True):
        for line, check in block_checks:
            reason = next(reasons)
            if reason is not None:
                what = f"{check[1]}.{check[2]}" if check[0] == "attribute" else "import"
                errors.append((block, f"{block.where}: line {line} of the block: {what}: {reason}"))
    return errors


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
    """Report every failing block on stdout; the number of failing blocks left."""
    failing: set[tuple[Path, int]] = set()
    checked = fragments = 0
    compiled: list[Block] = []
    for path in paths:
        fixes: dict[int, tuple[Block, str]] = {}
        for block in python_blocks(path):
            if block.fragment:
                fragments += 1
                continue
            checked += 1
            if (error := compile_error(block)) is not None:
                print(error)
                failing.add((block.path, block.line))
                continue
            compiled.append(block)
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
            failing.add((block.path, block.line))
        if fixes:
            rewrite(path, fixes)
    for block, error in import_errors(compiled):
        print(error)
        failing.add((block.path, block.line))
    failures = len(failing)
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
