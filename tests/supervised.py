"""Programs under supervision: child programs for the supervisor's tests, each logging its
attempts where it is told, and an example started under the installed `kaudit run`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from tests.helpers import KAUDIT

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


def supervised(
    example: Path | str,
    *args: str,
    cwd: Path,
    retries: int = 5,
    launcher: Sequence[str] = (sys.executable,),
    env: dict[str, str] | None = None,
    json: bool = False,
) -> subprocess.Popen[str]:
    """The Python program ``example`` with ``args``, run by ``launcher`` (this Python, or
    mpiexec's command line up to the program) from ``cwd``, under the installed `kaudit
    run`: restarted at once when it dies, up to ``retries`` times. Its output is piped; with
    ``json`` its summary is one JSON line, the last of its stderr. The caller waits for it
    and kills it when done."""
    return subprocess.Popen(
        [
            *KAUDIT,
            "run",
            *(["--json"] if json else []),
            *("--retries", str(retries), "--backoff", "0", "--"),
            *launcher,
            str(example),
            *args,
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
