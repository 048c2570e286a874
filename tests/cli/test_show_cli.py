"""`kaudit show` on the steps of a sharded run: the restart count and the shard count, and
the parent step's count when it differs (a restart on another number of ranks, an elastic
job re-formed), found beside the step and believed only when its digest is the recorded one.

The steps are real: each rank's shard written and hashed, rank 0's index and signed step
manifest (``sign_sharded_step``), as ``ka.Run`` writes them on several ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kronos_audit.checkpoint.layout import step_directory
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.statement.manifest import Manifest
from tests.checkpoint.test_shards import LAYOUT, write_shards
from tests.helpers import run_cli


def step(
    project: Project,
    key: SigningKey,
    number: int,
    count: int,
    *,
    parent: Manifest | None = None,
    restarts: int = 0,
    run_dir: Path | None = None,
) -> Manifest:
    """Step ``number`` of run ``heat``, written by ``count`` ranks after ``restarts``
    restarts of the job."""
    directory = step_directory(run_dir or project.root / "checkpoints" / "heat", number)
    return sign_sharded_step(
        directory,
        write_shards(directory, number, count),
        project=project,
        key=key,
        run="heat",
        step=number,
        layout=LAYOUT,
        parent=parent,
        seeds=[7],
        record=RunRecord(restart_count=restarts),
    )


def shown(manifest: Path) -> str:
    result = run_cli("show", str(manifest))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_show_says_the_parent_step_had_another_number_of_ranks(
    project: Project, key: SigningKey
) -> None:
    four = step(project, key, 4, 4)
    six = step(project, key, 6, 2, parent=four, restarts=1)
    eight = step(project, key, 8, 2, parent=six, restarts=1)
    out = shown(six.path)
    assert "restarts     1\n" in out
    assert "shards       2 ranks (the parent step had 4), " in out
    assert "step-00000004/index.jsonl.kaudit.json" in out  # the parent line, as before
    # a step directory stands for its manifest
    assert shown(six.path.parent) == out
    # as many ranks as the parent step: the count alone
    assert "shards       2 ranks, " in shown(eight.path)
    # the first step of the chain: no parent, the count alone
    first = shown(four.path)
    assert "shards       4 ranks, " in first
    assert "restarts     0\n" in first


def test_without_its_parent_a_step_shows_its_count_alone(project: Project, key: SigningKey) -> None:
    four = step(project, key, 4, 4)
    six = step(project, key, 6, 2, parent=four, restarts=1)
    shutil.rmtree(four.path.parent)
    out = shown(six.path)
    assert "shards       2 ranks, " in out
    assert "the parent step" not in out


def test_a_file_at_the_parents_place_without_its_digest_is_not_the_parent(
    project: Project, key: SigningKey
) -> None:
    four = step(project, key, 4, 4)
    six = step(project, key, 6, 2, parent=four)
    # Another valid, signed step manifest (of 3 ranks) put where the parent was: its
    # digest is not the recorded one, so show claims nothing about the parent's ranks.
    other = step(project, key, 4, 3, run_dir=project.root / "checkpoints" / "other")
    four.path.write_bytes(other.path.read_bytes())
    out = shown(six.path)
    assert "shards       2 ranks, " in out
    assert "had 3" not in out
    assert "had 4" not in out


def test_a_moved_run_directory_still_finds_the_parent_beside_the_step(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    four = step(project, key, 4, 4)
    six = step(project, key, 6, 2, parent=four)
    moved = tmp_path / "elsewhere" / "heat"
    shutil.copytree(six.path.parent.parent, moved)
    shutil.rmtree(project.root / "checkpoints" / "heat")
    out = shown(moved / "step-00000006")
    assert "shards       2 ranks (the parent step had 4), " in out


def test_a_parent_recorded_outside_the_run_directory_is_not_followed(
    project: Project, key: SigningKey
) -> None:
    # A parent in another run's directory (it exists and has the recorded digest): show
    # looks for the parent only in the step's own run directory.
    three = step(project, key, 4, 3, run_dir=project.root / "checkpoints" / "other")
    six = step(project, key, 6, 2, parent=three)
    assert six.record.parent_manifest == "checkpoints/other/step-00000004/index.jsonl.kaudit.json"
    out = shown(six.path)
    assert "shards       2 ranks, " in out
    assert "the parent step" not in out
