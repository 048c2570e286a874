"""The digest of pyproject.toml's dependency tables that constraints.txt records, and the
header line that records it (printed by the command below).

scripts/lock.sh writes it into the lock's header; tests/test_lock.py recomputes it, so a range
edited in pyproject.toml without a refreshed lock fails the suite even where the old pins
still happen to satisfy the new range.

    python scripts/lock_digest.py pyproject.toml
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

# The line of constraints.txt that carries the digest; the test reads it back by this prefix.
PREFIX = "# pyproject.toml's dependency tables, sha256: "


def dependency_digest(pyproject: str) -> str:
    """sha256 (hex) over what pyproject.toml says the project needs: requires-python,
    dependencies and every optional-dependencies table, as canonical JSON, so comments and
    layout do not count and any change of a requirement does."""
    project = tomllib.loads(pyproject)["project"]
    tables = {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
    }
    canonical = json.dumps(tables, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


if __name__ == "__main__":
    (path,) = sys.argv[1:]
    print(PREFIX + dependency_digest(Path(path).read_text(encoding="utf-8")))
