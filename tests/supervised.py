"""Child programs for the supervisor's tests: each logs its attempts where it is told."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

PRELUDE = """\
import os, signal, sys, time
from pathlib import Path

HERE = Path(sys.argv[1])
N = int(os.environ["KAUDIT_RESTART_COUNT"])


def log(name, value):
    with open(HERE / name, "a") as f:
        f.write(f"{value}\\n")


log("attempts", N)
"""


def program(tmp_path: Path, body: str) -> list[str]:
    """A command running ``body`` after PRELUDE (N = restart count, log(name, value))."""
    path = tmp_path / "child.py"
    path.write_text(PRELUDE + textwrap.dedent(body))
    return [sys.executable, str(path), str(tmp_path)]


def logged(tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / name
    return path.read_text().splitlines() if path.exists() else []
