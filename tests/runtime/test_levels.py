"""The level declarations: ka.MemoryLevel and ka.PartnerLevel, checked when made."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.errors import ExitCode, UsageError
from kronos_audit.runtime.levels.nodes import memory_directory


def test_a_memory_level_holds_an_absolute_directory(tmp_path: Path) -> None:
    level = ka.MemoryLevel(str(tmp_path), every=2, keep=3)
    assert level.dir == tmp_path
    assert (level.every, level.keep) == (2, 3)
    assert ka.MemoryLevel(tmp_path) == ka.MemoryLevel(str(tmp_path), every=None, keep=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        level.every = 5  # type: ignore[misc]


def test_a_partner_level_defaults_to_every_step_and_one_kept() -> None:
    level = ka.PartnerLevel()
    assert (level.every, level.keep, level.nodes) == (None, 1, None)
    assert ka.PartnerLevel(every=4, keep=2, nodes=3).nodes == 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: ka.MemoryLevel("shm/run"), "dir must be an absolute path, got 'shm/run'"),
        (lambda d: ka.MemoryLevel(f"{d}/{{rank}}"), "may hold {node} and no other braces"),
        (lambda d: ka.MemoryLevel(f"{d}/{{node"), "may hold {node} and no other braces"),
        (lambda d: memory_directory(ka.MemoryLevel(d / "gone"), 0), "gone' does not exist"),
        (lambda d: memory_directory(ka.MemoryLevel(d / "file"), 0), "is not a directory"),
        (lambda d: memory_directory(ka.MemoryLevel(d / "n{node}"), 1), "n1' does not exist"),
        (
            lambda d: ka.MemoryLevel(42),  # type: ignore[arg-type]
            "dir must be a path",
        ),
        (lambda d: ka.MemoryLevel(d, every=0), "every must be a positive whole number, got 0"),
        (lambda d: ka.MemoryLevel(d, keep=-1), "keep must be a positive whole number"),
        (lambda d: ka.MemoryLevel(d, keep=True), "keep must be a positive whole number"),
        (
            lambda d: ka.MemoryLevel(d, every=1.5),  # type: ignore[arg-type]
            "every must be a positive whole number",
        ),
        (lambda d: ka.PartnerLevel(every=0), "every must be a positive whole number"),
        (lambda d: ka.PartnerLevel(keep=0), "keep must be a positive whole number"),
        (lambda d: ka.PartnerLevel(nodes=1), "nodes must be at least 2"),
        (lambda d: ka.PartnerLevel(nodes=0), "nodes must be a positive whole number"),
    ],
)
def test_a_bad_declaration_is_one_line_and_a_usage_error(
    tmp_path: Path, make: object, message: str
) -> None:
    (tmp_path / "file").write_text("")
    assert callable(make)
    with pytest.raises(UsageError, match=message) as caught:
        make(tmp_path)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == ExitCode.BAD_INPUT


def test_declaring_levels_loads_nothing_heavy(tmp_path: Path) -> None:
    code = (
        "import sys, kronos_audit as ka\n"
        f"ka.MemoryLevel({str(tmp_path)!r}, every=1, keep=2)\n"
        "ka.PartnerLevel(every=1, nodes=3)\n"
        "heavy = {'h5py', 'numpy', 'dvc', 'git', 'cryptography', 'click', 'rich'}\n"
        "print(sorted(heavy & {m.partition('.')[0] for m in sys.modules}))\n"
        "print('kronos_audit.runtime.run' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert done.stdout.splitlines() == ["[]", "False"]


def test_the_memory_directory_is_the_nodes(tmp_path: Path) -> None:
    (tmp_path / "node2").mkdir()
    level = ka.MemoryLevel(f"{tmp_path}/node{{node}}")
    assert memory_directory(level, 2) == tmp_path / "node2"
