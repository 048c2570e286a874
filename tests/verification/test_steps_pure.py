"""verification/steps.py makes the trust decisions with no I/O, as its header says: read
from its source, it imports nothing that reaches a file or a process, and calls nothing
that opens, reads, stats or resolves a path."""

from __future__ import annotations

import ast
from pathlib import Path

import kronos_audit.verification.steps as steps

IO_MODULES = {"os", "io", "shutil", "subprocess", "socket", "h5py", "tempfile", "glob"}
IO_PACKAGES = (
    "kronos_audit.storage",
    "kronos_audit._internal.safeio",
    "kronos_audit._internal.git",
)
IO_CALLS = {
    "open",
    "read_bytes",
    "read_text",
    "write_bytes",
    "write_text",
    "stat",
    "lstat",
    "exists",
    "is_file",
    "is_dir",
    "is_symlink",
    "resolve",
    "iterdir",
    "glob",
    "rglob",
    "readlink",
}


def _offences(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in IO_MODULES or node.module.startswith(IO_PACKAGES):
                found.append(node.module)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in IO_CALLS:
                found.append(f"{name}() at line {node.lineno}")
    return found


def test_the_detector_finds_io() -> None:
    assert _offences("import os\nfrom kronos_audit.storage.fetch import x\np.read_bytes()\n") == [
        "os",
        "kronos_audit.storage.fetch",
        "read_bytes() at line 3",
    ]


def test_the_trust_decisions_do_no_io() -> None:
    source = Path(steps.__file__).read_text(encoding="utf-8")
    assert _offences(source) == []
