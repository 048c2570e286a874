"""Install the arguments into this Python's environment with uv, from where pip installs.

pip's configuration (its files and PIP_* variables, as `pip config list` shows them) is
turned into uv's variables, and uv resolves as pip does: the best version across every
index, not the first index that has the package. Exits 3 without installing anything when
pip has a setting uv would not honour the same way; the caller then uses pip.

    python scripts/uv_install.py -e '.[test]'

With `compile` first, runs `uv pip compile` with the rest from the same indexes instead
(scripts/lock.sh, which writes the lock, constraints.txt).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

UV_NAMES = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
    "constraint": "UV_CONSTRAINT",
    "cert": "SSL_CERT_FILE",
}
IGNORED = {
    "config-file",  # where the settings were read from: they are the other lines
    "default-timeout",
    "timeout",
    "disable-pip-version-check",
    "quiet",
    "no-cache-dir",
}
CANNOT = 3
# Not for a lock, which is for every machine: find-links hold this machine's own builds (the
# CPU wheel of torch, whose local label +cpu no index has, would fork the universal resolution
# per platform), and pip's constraint is this machine's cap, not a pin of the project's.
NOT_FOR_A_LOCK = ("UV_FIND_LINKS", "UV_CONSTRAINT")


def uv_environment() -> dict[str, str] | None:
    """uv's variables for pip's settings; None for a setting uv would take differently."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    if listed.returncode != 0:
        return None
    settings = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    # One line per level, the more specific ones later and PIP_* variables (":env:") last.
    for line in listed.stdout.splitlines():
        name, _, value = line.partition("=")
        key = name.split(".", 1)[-1]
        if key in IGNORED:
            continue
        if key not in UV_NAMES:
            return None
        (settings[UV_NAMES[key]],) = shlex.split(value) or [""]
    return settings


def main(args: list[str]) -> int:
    settings = uv_environment()
    if settings is None:
        return CANNOT
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        return CANNOT
    environment = {**os.environ, **settings}
    if args[:1] == ["compile"]:
        for name in NOT_FOR_A_LOCK:
            environment.pop(name, None)
        return subprocess.run([str(uv), "pip", *args], env=environment).returncode
    command = [str(uv), "pip", "install", "--quiet", "--python", sys.executable]
    return subprocess.run([*command, "--compile-bytecode", *args], env=environment).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
