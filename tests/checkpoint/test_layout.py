"""The names of a run's directory: one parser, every kind, round trips, hostile names."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.checkpoint.layout import (
    ATTESTATION_SUFFIX,
    INDEX_NAME,
    MANIFEST_SUFFIX,
    MAX_STEP,
    STEP_MANIFEST,
    TREE_NAME,
    NameKind,
    ParsedName,
    RunDirectory,
    attestation_path_for,
    attested_manifest_for,
    checkpoint_name,
    checkpoint_path_for,
    checkpoint_steps,
    manifest_path_for,
    named_step,
    parse_name,
    shard_name,
    shard_path,
    step_directory,
    step_directory_name,
    step_of,
    step_of_directory,
    step_of_manifest_name,
)
from kronos_audit.errors import ManifestError

# -- every kind of name ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("step-00000400.h5", ParsedName(NameKind.CHECKPOINT, 400, True)),
        ("step-400.h5", ParsedName(NameKind.CHECKPOINT, 400, False)),
        ("step-00000400.h5.kaudit.json", ParsedName(NameKind.MANIFEST, 400, True)),
        ("step-400.h5.kaudit.json", ParsedName(NameKind.MANIFEST, 400, False)),
        ("step-00000400.h5.replay.json", ParsedName(NameKind.ATTESTATION, 400, True)),
        ("step-00000400", ParsedName(NameKind.STEP_DIRECTORY, 400, True)),
        ("step-400", ParsedName(NameKind.STEP_DIRECTORY, 400, False)),
        ("step-5.h5.bak", ParsedName(NameKind.STEP_NAMED, 5, False)),
        ("step-00000005.h5.dvc", ParsedName(NameKind.STEP_NAMED, 5, True)),
        ("step-5.", ParsedName(NameKind.STEP_NAMED, 5, False)),
        ("index.jsonl", ParsedName(NameKind.INDEX, None, True)),
        ("index.merkle", ParsedName(NameKind.TREE, None, True)),
        ("index.jsonl.kaudit.json", ParsedName(NameKind.STEP_MANIFEST, None, True)),
        ("rank-000002-of-000003.h5", ParsedName(NameKind.SHARD, None, True, 2, 3)),
        ("rank-000002-of-000003.h5.dvc", ParsedName(NameKind.SHARD_DVC, None, True, 2, 3)),
        ("rank-000000-of-1000000.h5", ParsedName(NameKind.SHARD, None, True, 0, 1_000_000)),
    ],
)
def test_every_kind_of_name_is_read_one_way(name: str, parsed: ParsedName) -> None:
    assert parse_name(name) == parsed


def test_the_fixed_names_are_the_ones_a_step_directory_holds() -> None:
    assert (INDEX_NAME, TREE_NAME, STEP_MANIFEST) == (
        "index.jsonl",
        "index.merkle",
        "index.jsonl.kaudit.json",
    )
    assert (MANIFEST_SUFFIX, ATTESTATION_SUFFIX) == (".kaudit.json", ".replay.json")


@pytest.mark.parametrize(
    "name",
    [
        "",
        "model-step-5.h5",
        "step-5x.h5",
        "step-.h5",
        "step-",
        "step",
        "Step-5.h5",
        "step--5.h5",
        "step-+5.h5",
        "step- 5.h5",
        "step-0x10.h5",
        "index.jsonl.tmp",
        "rank-2-of-3.h5",  # a shard has one spelling
        "rank-000002-of-000003",
        "rank-000002-000003.h5",
        "rank-000002-of-000003.h5.bak",
        ".kaudit.json",
    ],
)
def test_names_that_are_none_of_kaudits(name: str) -> None:
    assert parse_name(name) is None
    assert named_step(name) is None


# -- the readers each place uses, as they read today ---------------------------------------


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step-00000005.h5", 5),
        ("step-5.h5", 5),
        ("step-" + "0" * 60 + "7.h5", 7),
        ("step-5.h5.bak", 5),  # snapshot and verify read step 5 from it
        ("step-5", 5),
        ("step-5.h5.kaudit.json", 5),
        ("step-5x.h5", None),
        ("model-step-5.h5", None),
    ],
)
def test_the_step_a_name_states(name: str, step: int | None) -> None:
    assert named_step(name) == step


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step-00000005.h5", 5),
        ("step-5.h5", 5),  # a checkpoint file however its digits are spelled
        ("step-5.h5.bak", None),
        ("step-5", None),
        ("step-5.h5.kaudit.json", None),
        ("step-.h5", None),
    ],
)
def test_the_step_of_a_checkpoint_file(name: str, step: int | None) -> None:
    assert step_of(Path("run") / name) == step


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step-00000005.h5.kaudit.json", 5),
        ("step-123456789.h5.kaudit.json", 123_456_789),
        ("step-5.h5.kaudit.json", None),  # the same step spelled another way
        ("step-000000005.h5.kaudit.json", None),
        ("step-00000005.h5", None),
        (".step-00000005.h5.kaudit.json.tmp", None),
        ("step-00000005.h5.replay.json", None),
    ],
)
def test_a_run_reads_only_its_own_spelling_of_a_manifest(name: str, step: int | None) -> None:
    assert step_of_manifest_name(name) == step


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step-00000005", 5),
        ("step-5", None),
        ("step-000000005", None),
        ("step-00000005.h5", None),
        ("step-0000000x", None),
    ],
)
def test_a_run_reads_only_its_own_spelling_of_a_step_directory(name: str, step: int | None) -> None:
    assert step_of_directory(name) == step


# -- round trips ---------------------------------------------------------------------------

STEPS = [0, 1, 400, 99_999_999, 100_000_000, 10**18, MAX_STEP]


@pytest.mark.parametrize("step", STEPS)
def test_every_name_kaudit_writes_reads_back_as_its_step(step: int) -> None:
    run = RunDirectory(Path("runs") / "heat")
    assert run.checkpoint(step).name == checkpoint_name(step)
    assert parse_name(checkpoint_name(step)) == ParsedName(NameKind.CHECKPOINT, step, True)
    assert step_of(run.checkpoint(step)) == step
    assert parse_name(run.manifest(step).name) == ParsedName(NameKind.MANIFEST, step, True)
    assert step_of_manifest_name(run.manifest(step).name) == step
    assert parse_name(run.attestation(step).name) == ParsedName(NameKind.ATTESTATION, step, True)
    assert run.step_directory(step) == step_directory(run.path, step)
    assert run.step_directory(step).name == step_directory_name(step)
    assert step_of_directory(step_directory_name(step)) == step
    assert named_step(run.step_directory(step).name) == step
    assert run.step_index(step) == run.step_directory(step) / INDEX_NAME
    assert run.step_manifest(step) == run.step_directory(step) / STEP_MANIFEST
    assert run.shard(step, 1, 4) == shard_path(run.step_directory(step), 1, 4)


def test_a_step_is_named_with_eight_digits_at_least() -> None:
    assert checkpoint_name(400) == "step-00000400.h5"
    assert step_directory_name(400) == "step-00000400"
    assert checkpoint_name(123_456_789) == "step-123456789.h5"
    assert shard_name(2, 3) == "rank-000002-of-000003.h5"


@pytest.mark.parametrize(("rank", "count"), [(0, 1), (2, 3), (999_999, 1_000_000)])
def test_a_shard_name_reads_back_as_its_rank_and_count(rank: int, count: int) -> None:
    parsed = parse_name(shard_name(rank, count))
    assert parsed == ParsedName(NameKind.SHARD, None, True, rank, count)
    dvc = parse_name(shard_name(rank, count) + ".dvc")
    assert dvc == ParsedName(NameKind.SHARD_DVC, None, True, rank, count)


def test_manifest_checkpoint_and_attestation_paths_round_trip() -> None:
    checkpoint = Path("runs") / "heat" / "anything.h5"
    manifest = manifest_path_for(checkpoint)
    assert manifest.name == "anything.h5.kaudit.json"
    assert checkpoint_path_for(manifest) == checkpoint
    attestation = attestation_path_for(manifest)
    assert attestation.name == "anything.h5.replay.json"
    assert attested_manifest_for(attestation) == manifest
    for not_a_manifest in (Path("x.h5"), Path(MANIFEST_SUFFIX)):
        with pytest.raises(ManifestError, match="a manifest's name ends in"):
            checkpoint_path_for(not_a_manifest)
        with pytest.raises(ManifestError):
            attestation_path_for(not_a_manifest)


# -- hostile names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "step-5/x.h5",
        "step-5.h5/../step-6.h5",
        "../step-5.h5",
        "step-5\\..\\x.h5",
        "step-5\0.h5",
        "step-5.h5\0",
        ".",
        "..",
        "step-00000005/index.jsonl.kaudit.json",
        "rank-000000-of-000001.h5/..",
    ],
)
def test_a_name_with_a_path_in_it_is_refused(name: str) -> None:
    assert parse_name(name) is None
    assert named_step(name) is None


@pytest.mark.parametrize(
    "digits",
    [
        "\u0665",  # ARABIC-INDIC DIGIT FIVE
        "\uff15",  # FULLWIDTH DIGIT FIVE
        "\u00b2",  # SUPERSCRIPT TWO: isdigit() but not a number int() reads
        "\u0966\u0966\u0966\u0966\u0966\u0966\u0966\u096b",  # DEVANAGARI, eight of them
        "0000000\u0665",
        "\U0001d7d3",  # MATHEMATICAL BOLD DIGIT FIVE
    ],
)
def test_a_step_in_other_than_ascii_digits_is_refused(digits: str) -> None:
    for name in (f"step-{digits}", f"step-{digits}.h5", f"step-{digits}.h5.kaudit.json"):
        assert parse_name(name) is None
        assert named_step(name) is None
    assert step_of(Path(f"step-{digits}.h5")) is None
    assert step_of_directory(f"step-{digits}") is None
    assert parse_name(f"rank-{digits}-of-000001.h5") is None


@pytest.mark.parametrize(
    "digits",
    [
        str(MAX_STEP + 1),
        "9" * 19,
        "1" * 20,
        "1" * 5000,  # past Python's int() digit limit: refused without converting
        "9" * 1_000_000,
    ],
)
def test_a_step_past_the_largest_is_refused(digits: str) -> None:
    for name in (f"step-{digits}", f"step-{digits}.h5", f"step-{digits}.h5.kaudit.json"):
        assert parse_name(name) is None
    assert parse_name(f"rank-000000-of-{digits}.h5") is None


def test_the_largest_step_and_any_leading_zeros_are_read() -> None:
    assert named_step(f"step-{MAX_STEP}.h5") == MAX_STEP
    assert named_step("step-" + "0" * 100_000 + "7.h5") == 7
    assert named_step("step-" + "0" * 100_000) == 0


# -- a run's directory, listed ----------------------------------------------------------------


def test_a_run_directory_lists_what_its_names_say(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    for name in (
        "step-00000001.h5",
        "step-00000001.h5.kaudit.json",
        "step-2.h5",  # a checkpoint, not signed, not the runtime's spelling
        "step-00000003.h5",
        "step-00000003.h5.kaudit.json",
        "step-4.h5.kaudit.json",  # a manifest, but not the runtime's spelling
        "step-\u0665.h5",
        "step-\u0665.h5.kaudit.json",
        "step-00000006.h5.bak",
        "notes.h5",
    ):
        (tmp_path / name).write_bytes(b"")
    for name in ("step-00000007", "step-8", "step-\u0669", "step-00000010"):
        (tmp_path / name).mkdir()
        if name != "step-00000010":
            (tmp_path / name / STEP_MANIFEST).write_bytes(b"")
    (tmp_path / "step-00000010" / INDEX_NAME).write_bytes(b"")

    assert run.checkpoint_steps() == checkpoint_steps(tmp_path) == [1, 2, 3]
    assert run.checkpoints() == [(s, tmp_path / n) for s, n in [
        (1, "step-00000001.h5"), (2, "step-2.h5"), (3, "step-00000003.h5")
    ]]  # fmt: skip
    assert run.signed_checkpoint_steps() == [1, 3]
    assert run.canonical_manifests() == [
        (1, run.manifest(1)),
        (3, run.manifest(3)),
    ]
    assert run.step_manifests() == [(7, run.step_manifest(7))]
    assert run.sharded_steps() == [7]
    (tmp_path / "step-00000007" / ".tmp-leftover").write_bytes(b"")
    assert run.step_files(".tmp-*") == [tmp_path / "step-00000007" / ".tmp-leftover"]
