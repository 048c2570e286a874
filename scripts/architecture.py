"""Write the rooms of docs/architecture.md from the package itself.

The section between the two markers in docs/architecture.md lists the package's layers in
the order ``tests/test_layers.py`` holds them (``LAYERS``, lowest first), and for each
room what its ``__init__`` docstring says and every module in it with the first sentence
of its docstring. The page cannot drift from the folders: a test runs ``--check``.

Run: python scripts/architecture.py [--check]
Exit 0 when the page is written (or, with --check, already up to date), 1 with --check when
it is not, 2 when the markers, the layer list or a docstring are missing.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kronos_audit"
PAGE = ROOT / "docs" / "architecture.md"
LAYERS_FILE = ROOT / "tests" / "test_layers.py"
BEGIN = "<!-- rooms: written by scripts/architecture.py; edit the docstrings, not this -->"
END = "<!-- end of rooms -->"


class Problem(Exception):
    """What makes the page impossible to write: one line for the user."""


def layers() -> list[str]:
    tree = ast.parse(LAYERS_FILE.read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "LAYERS"
            and node.value is not None
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                return list(value)
    raise Problem(f"{LAYERS_FILE.relative_to(ROOT)}: no LAYERS tuple of names")


def docstring(path: Path) -> str:
    text = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not text:
        raise Problem(f"{path.relative_to(ROOT)}: no docstring")
    return text


def first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def first_sentence(text: str) -> str:
    """Up to the first full stop, colon or semicolon outside brackets, ending in a stop."""
    paragraph = first_paragraph(text)
    depth = 0
    for i, c in enumerate(paragraph):
        depth += c in "([{"
        depth -= c in ")]}"
        at_end = i + 1 == len(paragraph) or paragraph[i + 1] == " "
        if c in ".:;" and depth <= 0 and at_end:
            return paragraph[:i] + "."
    return paragraph


def modules_of(directory: Path) -> list[Path]:
    found = []
    for path in sorted(directory.rglob("*.py")):
        if path.name != "__init__.py" or path.parent != directory:
            found.append(path)
    return found


def _module_label(path: Path, room: Path) -> str:
    relative = path.relative_to(room)
    if relative.name == "__init__.py":
        return f"`{relative.parent.as_posix()}/`"
    return f"`{relative.with_suffix('').as_posix()}`"


def rooms() -> str:
    lines: list[str] = []
    for number, layer in enumerate(layers(), start=1):
        directory = PACKAGE / layer
        if directory.is_dir():
            lines.append(f"### {number}. `{layer}/`")
            lines.append("")
            lines.append(first_paragraph(docstring(directory / "__init__.py")))
            lines.append("")
            for path in modules_of(directory):
                lines.append(
                    f"- {_module_label(path, directory)}: {first_sentence(docstring(path))}"
                )
        else:
            path = PACKAGE / f"{layer}.py"
            if not path.is_file():
                raise Problem(f"layer {layer!r}: no kronos_audit/{layer}/ nor {layer}.py")
            lines.append(f"### {number}. `{layer}.py`")
            lines.append("")
            lines.append(first_paragraph(docstring(path)))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render(page: str) -> str:
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise Problem(f"{PAGE.relative_to(ROOT)}: the markers {BEGIN!r} ... {END!r} are missing")
    return page[: start + len(BEGIN)] + "\n\n" + rooms() + "\n" + page[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is up to date")
    args = parser.parse_args(argv)
    try:
        page = PAGE.read_text(encoding="utf-8")
        new = render(page)
    except (OSError, SyntaxError, ValueError, Problem) as e:
        print(f"architecture: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != page:
            print(
                f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/architecture.py",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
