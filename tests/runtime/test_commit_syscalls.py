"""What a power cut can take, read from the system calls of real commits.

A program commits two steps (one process: checkpoint files; two thread ranks: sharded
steps) under ``strace -f`` (Debian's strace, installed by scripts/ensure-tools.sh), which
records every write, fsync, rename, link and mkdir with the path of each descriptor
(``-y``). For each step, for every file its manifest covers (the checkpoint file, or the
shards, the shard index and its tree; their ``.dvc`` files; their objects in DVC's cache;
the manifest itself) the record must show:

    write -> fsync(file) -> rename/link into its name -> fsync(its directory)

and, but for the manifest's own directory fsync, all of it before the manifest's rename,
with every directory made on the way (the step's directory, DVC's fan-out directories)
followed by an fsync of its parent before it too. A power cut then takes either the whole
step or nothing of what its manifest signs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kronos_audit.checkpoint.layout import INDEX_NAME, TREE_NAME
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage.steps import step_items
from kronos_audit.storage.tracking import cache_object_path, dvc_file_for

pytestmark = pytest.mark.slow

HANG_GUARD = 300.0  # seconds; only stops a broken test from hanging CI, never a timing claim
TESTS_ROOT = Path(__file__).resolve().parents[2]
RUN = "sc"
END = 10**12  # a line after every line of a record
WRITES = ("write", "pwrite", "ftruncate", "fallocate", "sendfile", "copy_file_range", "ioctl")
"""The calls that change a file's bytes (the names as :func:`parse` gives them)."""
TRACED = (
    "write,pwrite64,writev,pwritev,pwritev2,ftruncate,fallocate,sendfile,copy_file_range,"
    "ioctl,fsync,fdatasync,rename,renameat,renameat2,link,linkat,symlink,symlinkat,mkdir,"
    "mkdirat"
)

PROGRAM = """
import sys
from pathlib import Path
import numpy as np
import kronos_audit as ka

ranks = int(sys.argv[1])


def steps(run, rank, layout):
    run.restore()
    for step in (1, 2):
        run.checkpoint(step, {"u": np.arange(64.0).reshape(8, 8) + 10 * step + rank}, **layout)


if ranks == 1:
    options = {"seed": 5, "every": ka.EverySteps(1), "asynchronous": False}
    with ka.Run("sc", root="checkpoints", **options) as run:
        steps(run, 0, {})
else:
    from tests.threadranks import on_ranks, thread_run

    def program(comm):
        with thread_run(Path.cwd(), "sc", comm) as run:
            steps(run, comm.rank, {"layout": {"u": ka.Block(axis=0)}})

    on_ranks(ranks, program)
"""


def strace() -> str:
    """The strace to record with; the test is skipped, saying why, when none can run."""
    found = shutil.which("strace")
    if found is None:
        proc = subprocess.run(
            ["bash", str(TESTS_ROOT / "scripts" / "ensure-tools.sh"), "strace"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        found = shutil.which("strace")
        if found is None:
            why = proc.stderr.strip() or f"exit status {proc.returncode}"
            pytest.skip(f"strace is not installed and scripts/ensure-tools.sh failed: {why}")
    probe = subprocess.run(
        [found, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        reason = probe.stderr.strip().splitlines()[-1:] or ["no reason given"]
        pytest.skip(f"strace cannot trace here (ptrace refused?): {reason[0]}")
    return found


@dataclass(frozen=True)
class Call:
    """One system call that succeeded, as strace recorded it."""

    name: str
    """Its name, the ``*at`` variants named as the plain call (``renameat2`` -> rename)."""
    start: int
    """The record's line where it began."""
    end: int
    """The record's line where it returned."""
    paths: tuple[str, ...]
    """The paths it names, absolute: a descriptor's (``-y``), or a name resolved against
    the directory it is relative to (the program's, or a descriptor's)."""


_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _args(text: str) -> list[str]:
    """The top-level arguments of a call (strace puts none of our paths in braces)."""
    out, depth, current, quoted, escaped = [], 0, "", False, False
    for ch in text:
        if quoted:
            current += ch
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
            continue
        if ch == '"':
            quoted = True
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += ch
    if current.strip():
        out.append(current.strip())
    return out


def _fd_path(arg: str) -> str | None:
    m = re.fullmatch(r"(?:-?\d+|AT_FDCWD)<(.*)>", arg)
    return None if m is None else m.group(1).removesuffix(" (deleted)")


def _name(arg: str, base: str) -> str:
    m = _STRING.fullmatch(arg)
    assert m is not None, arg
    name = m.group(1).encode().decode("unicode_escape")
    return os.path.normpath(os.path.join(base, name))


def parse(record: str, cwd: Path) -> list[Call]:
    """The successful calls of a ``strace -f -y -s 4096`` record, in order."""
    calls: list[Call] = []
    pending: dict[str, tuple[int, str]] = {}  # pid -> (line, text before "<unfinished")
    for number, line in enumerate(record.splitlines()):
        m = _LINE.match(line)
        if m is None:
            continue
        pid, text = m.groups()
        start = number
        if text.endswith("<unfinished ...>"):
            pending[pid] = (number, text.removesuffix("<unfinished ...>"))
            continue
        resumed = _RESUMED.match(text)
        if resumed is not None:
            if pid not in pending:
                continue
            start, head = pending.pop(pid)
            text = head + resumed.group(2)
        call = _CALL.match(text)
        if call is None or call.group(3) in ("?",) or call.group(3).startswith("-"):
            continue  # a signal, an exit, or a call that failed
        name, raw = call.group(1), _args(call.group(2))
        paths = _paths(name, raw, str(cwd))
        if paths is not None:
            calls.append(Call(re.sub(r"(at2?|64|v2?)$", "", name) or name, start, number, paths))
    return calls


def _paths(name: str, args: list[str], cwd: str) -> tuple[str, ...] | None:
    if name in ("rename", "link", "symlink"):
        return (_name(args[0], cwd) if name != "symlink" else args[0], _name(args[1], cwd))
    if name in ("renameat", "renameat2", "linkat"):
        a = _fd_path(args[0]) or cwd
        b = _fd_path(args[2]) or cwd
        return (_name(args[1], a), _name(args[3], b))
    if name == "symlinkat":
        return (args[0], _name(args[2], _fd_path(args[1]) or cwd))
    if name == "mkdir":
        return (_name(args[0], cwd),)
    if name == "mkdirat":
        return (_name(args[1], _fd_path(args[0]) or cwd),)
    if name in ("sendfile", "copy_file_range"):
        target = _fd_path(args[0] if name == "sendfile" else args[2])
        return None if target is None else (target,)
    if name == "ioctl":
        if "FICLONE" not in args[1]:
            return None
        target = _fd_path(args[0])
        return None if target is None else (target,)
    target = _fd_path(args[0]) if args else None  # write, pwrite, fsync, ftruncate ...
    return None if target is None else (target,)


class Record:
    """The calls of one program, asked in the terms of the ordering to check."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls

    def placing(self, name: str, before: int) -> Call | None:
        """The last rename or link into ``name`` that returned before line ``before``."""
        found = [c for c in self.calls if c.name in ("rename", "link") and c.paths[1] == name]
        found = [c for c in found if c.end < before]
        return found[-1] if found else None

    def names_of(self, name: str, at: int) -> Iterator[str]:
        """``name`` and every name its inode had before line ``at``: the temporary it was
        renamed from, the file it is a hard link of, and theirs."""
        yield name
        placed = self.placing(name, at)
        if placed is not None:
            yield from self.names_of(placed.paths[0], placed.start)

    def fsyncs(self, path: str, after: int, before: int) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.name in ("fsync", "fdatasync")
            and c.paths[0] == path
            and c.start > after
            and c.end < before
        ]

    def mkdirs(self, before: int) -> list[Call]:
        return [c for c in self.calls if c.name == "mkdir" and c.end < before]

    def durable(self, name: str, manifest: Call) -> list[str]:
        """What is wrong with ``name``'s way to disk, judged against the manifest's
        rename ``manifest`` (nothing: an empty list)."""
        problems: list[str] = []
        is_manifest = name == manifest.paths[1]
        placed = manifest if is_manifest else self.placing(name, manifest.start)
        if placed is None:
            return [f"{name}: not renamed or linked into place before the manifest"]
        # Its bytes: the last write under any of its names, then an fsync, then the rename.
        names = set(self.names_of(placed.paths[0], placed.start))
        writes = [
            c
            for c in self.calls
            if c.name in WRITES and c.paths[0] in names and c.end < placed.start
        ]
        if not writes:
            problems.append(f"{name}: no write of its bytes seen")
        else:
            last = writes[-1].end
            if not any(self.fsyncs(n, last, placed.start) for n in names):
                problems.append(f"{name}: not fsynced between its last write and its rename")
        # Its name: an fsync of its directory once it is there, before the manifest's.
        directory = os.path.dirname(name)
        until = END if is_manifest else manifest.start
        if not self.fsyncs(directory, placed.end, until):
            problems.append(f"{name}: its directory not fsynced after the rename")
        # Every directory made on its way: its parent fsynced before the manifest.
        for made in self.mkdirs(manifest.start):
            if name.startswith(made.paths[0] + os.sep) and not self.fsyncs(
                os.path.dirname(made.paths[0]), made.end, manifest.start
            ):
                problems.append(f"{made.paths[0]}: made, its parent not fsynced after")
        return problems


def covered(manifest_path: Path, cache: Path) -> list[Path]:
    """Every file the manifest covers: what it signs (and a sharded step's tree), their
    ``.dvc`` files and DVC cache objects, and itself."""
    manifest = read_manifest(manifest_path)
    items = step_items(manifest)
    assert items is not None
    files = [manifest_path]
    for item in items:
        files += [
            item.checkpoint,
            dvc_file_for(item.checkpoint),
            cache_object_path(cache, item.md5),
        ]
    if manifest.record.shards is not None:
        tree = manifest.checkpoint_path.with_name(TREE_NAME)
        files += [tree, dvc_file_for(tree)]
    return files


@pytest.mark.parametrize(
    ("ranks", "cache_type"),
    [(1, None), (2, None), (2, "copy")],
    ids=["file", "sharded", "sharded-copy"],
)
def test_every_file_a_manifest_covers_is_durable_before_it(
    project: Project, key: SigningKey, tmp_path: Path, ranks: int, cache_type: str | None
) -> None:
    tracer = strace()
    if cache_type is not None:
        (project.root / ".dvc" / "config.local").write_text(f"[cache]\n    type = {cache_type}\n")
    (project.root / "sc.py").write_text(PROGRAM)
    record = tmp_path / "strace.txt"
    done = subprocess.run(
        [
            tracer,
            "-f",
            "-qq",
            "-y",
            "-s",
            "4096",
            "-e",
            f"trace={TRACED}",
            "-e",
            "signal=none",
            "-o",
            str(record),
            sys.executable,
            "sc.py",
            str(ranks),
        ],
        cwd=project.root,
        env={**os.environ, "PYTHONPATH": str(TESTS_ROOT)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr
    root = project.root.resolve()
    calls = Record(parse(record.read_text(), root))
    cache = root / ".dvc" / "cache"
    run = root / "checkpoints" / RUN
    for step in (1, 2):
        if ranks == 1:
            manifest = run / f"step-{step:08d}.h5.kaudit.json"
        else:
            manifest = run / f"step-{step:08d}" / f"{INDEX_NAME}.kaudit.json"
        renamed = calls.placing(str(manifest), END)
        assert renamed is not None, f"step {step}: its manifest's rename is not in the record"
        problems = [p for f in covered(manifest, cache) for p in calls.durable(str(f), renamed)]
        assert problems == [], f"step {step}: " + "\n".join(problems)
