"""`kaudit init`, `keys`, `snapshot`, `verify`, `show` (kronos_audit.cli.commands).

Most tests call the click app in-process; the last few run kaudit as a subprocess, the
way a user or a CI job does.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import Result
from cryptography.hazmat.primitives import serialization

from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey, load_public_key, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import key_id
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage import cache_object_path, cache_settings
from tests.helpers import (
    KAUDIT,
    assert_bad_input,
    elsewhere,
    git,
    run_cli,
    untrusted_key,
    write_checkpoint,
)


def leftovers(root: Path) -> list[Path]:
    return sorted(
        p
        for pattern in ("*.kaudit.json", ".kaudit-tmp-*")
        for p in root.rglob(pattern)
        if ".git" not in p.parts
    )


def snapshot_cli(ckpt: Path, *args: str, step: int = 1, run: str = "run1") -> Result:
    return run_cli("snapshot", str(ckpt), "--run", run, "--step", str(step), *args)


# -- init -------------------------------------------------------------------------------


def test_init_sets_up_kaudit_and_dvc_and_is_idempotent(git_repo: Path) -> None:
    first = run_cli("init", cwd=git_repo)
    assert first.exit_code == 0, first.output
    assert f"kaudit repository at {git_repo.resolve()}" in first.stdout
    assert "initialised (.dvc/)" in first.stdout
    assert "kaudit keys generate" in first.stdout  # no key held yet
    config = git_repo / ".kaudit" / "config.toml"
    assert "config_version = 1" in config.read_text()
    assert (git_repo / ".kaudit" / "trusted-keys").is_dir()
    assert (git_repo / ".dvc").is_dir()
    config.write_text(config.read_text() + "# mine\n")
    again = run_cli("init", cwd=git_repo / ".kaudit")  # from a subdirectory
    assert again.exit_code == 0
    assert "already set up" in again.stdout
    assert config.read_text().endswith("# mine\n")


def test_init_stages_nothing_and_prints_the_command_that_commits_it(git_repo: Path) -> None:
    result = run_cli("init", cwd=git_repo)
    assert result.exit_code == 0, result.output
    # Nothing half-staged: no entry of git's index differs from HEAD.
    staged = [
        line for line in git(git_repo, "status", "--porcelain").splitlines() if line[0] != "?"
    ]
    assert staged == []
    (command,) = [
        line.removeprefix("commit it with: ")
        for line in result.stdout.splitlines()
        if line.startswith("commit it with: ")
    ]
    subprocess.run(["bash", "-c", command], cwd=git_repo, check=True, capture_output=True)
    assert git(git_repo, "status", "--porcelain") == ""
    again = run_cli("init", cwd=git_repo)
    assert "commit it with" not in again.stdout  # all committed: nothing to say

    generate_key("tester")
    ckpt = write_checkpoint(git_repo / "checkpoints" / "run1" / "step-1.h5", seed=1)
    assert run_cli("snapshot", str(ckpt), "--run", "run1", "--step", "1").exit_code == 0
    recorded = read_manifest(Path(f"{ckpt}.kaudit.json")).record.git
    assert (recorded.dirty, recorded.patch_sha256) == (False, None)


def test_init_outside_a_git_repository(tmp_path: Path) -> None:
    bare = tmp_path / "not-a-repo"
    bare.mkdir()
    line = assert_bad_input(run_cli("init", cwd=bare), "not inside a git repository")
    assert line == (
        f"kaudit: error: {bare.resolve()}: not inside a git repository (run `git init` first)"
    )
    assert list(bare.iterdir()) == []


# -- keys -------------------------------------------------------------------------------


def test_keys_generate_writes_a_private_key_and_trusts_its_public_key(
    project: Project, kaudit_home: Path
) -> None:
    result = run_cli("keys", "generate", "--name", "alice", cwd=project.root)
    assert result.exit_code == 0, result.output
    private_path = kaudit_home / "keys" / "alice.key"
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    private_key = serialization.load_pem_private_key(private_path.read_bytes(), password=None)
    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    kid = hashlib.sha256(raw).hexdigest()
    assert f"key alice: {kid}" in result.stdout
    trusted = project.root / ".kaudit" / "trusted-keys" / "alice.pub"
    assert key_id(load_public_key(trusted)) == kid
    assert str(trusted) in result.stdout

    again = run_cli("keys", "generate", "--name", "alice", cwd=project.root)
    assert_bad_input(again, str(private_path), "exists already")
    assert key_id(load_public_key(trusted)) == kid  # nothing replaced


def test_keys_generate_outside_a_kaudit_repository(tmp_path: Path, kaudit_home: Path) -> None:
    result = run_cli("keys", "generate", cwd=tmp_path)
    assert result.exit_code == 0
    assert "not in a kaudit repository" in result.stdout
    assert (kaudit_home / "keys" / "default.key").is_file()


def test_keys_list_shows_held_and_trusted_keys(project: Project, key: SigningKey) -> None:
    colleague = untrusted_key("colleague")  # held here but not trusted by the repository
    result = run_cli("keys", "list", cwd=project.root)
    assert result.exit_code == 0
    held, _, trusted = result.stdout.partition("keys verification trusts")
    assert "keys you hold" in held
    assert "tester" in held
    assert key.key_id[:16] in held
    assert "colleague" in held
    assert colleague.key_id[:16] in held
    assert "tester" in trusted
    assert key.key_id[:16] in trusted
    assert "colleague" not in trusted


def test_keys_list_outside_a_repository_has_no_trust_store(tmp_path: Path) -> None:
    generate_key("solo")
    result = run_cli("keys", "list", cwd=tmp_path)
    assert result.exit_code == 0
    held, _, trusted = result.stdout.partition("keys verification trusts")
    assert "solo" in held
    assert "solo" in trusted  # generated keys are anchored in the user's own trust store
    assert "user trust store" in trusted


def test_trusting_a_colleagues_key_makes_their_manifests_verify(
    project: Project,
    key: SigningKey,
    checkpoint: Path,
    tmp_path: Path,
) -> None:
    # The colleague signs on their machine, with their own key directory.
    with elsewhere(tmp_path / "colleague-home"):
        theirs = generate_key("bob")
        (m,) = snapshot(checkpoint, run="run1", step=1)
    shared = tmp_path / "bob.pub"
    shared.write_bytes(public_pem(theirs.private_key.public_key()))

    before = run_cli("verify", str(m.path))
    assert before.exit_code == 1
    assert "signature: signed by a key no trust anchor holds" in before.stdout

    trusted = run_cli("keys", "trust", str(shared), cwd=project.root)
    assert trusted.exit_code == 0, trusted.output
    assert f"trusted bob: {theirs.key_id}" in trusted.stdout
    assert (project.root / ".kaudit" / "trusted-keys" / "bob.pub").is_file()
    # Proposed in the repository: unanchored, so not yet enough for this verifier...
    proposed = run_cli("verify", str(m.path))
    assert proposed.exit_code == 1, proposed.output
    assert "unanchored" in proposed.stdout
    # ...anchored in their own user trust store: it is.
    assert run_cli("keys", "trust", "--user", str(shared)).exit_code == 0
    assert run_cli("verify", str(m.path)).exit_code == 0


def test_keys_trust_rejects_what_is_not_a_public_key(project: Project, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pub"
    junk.write_text("ssh-ed25519 AAAA not pem\n")
    assert_bad_input(run_cli("keys", "trust", str(junk), cwd=project.root), str(junk), "PEM")
    missing = tmp_path / "missing.pub"
    assert_bad_input(run_cli("keys", "trust", str(missing), cwd=project.root), str(missing))
    assert list((project.root / ".kaudit" / "trusted-keys").iterdir()) == []


# -- snapshot ---------------------------------------------------------------------------


def test_snapshot_prints_the_manifest_path_and_records_the_options(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    result = snapshot_cli(
        checkpoint,
        "--seed",
        "11",
        "--seed",
        "12",
        "--command",
        "python solver.py --out 'a dir'",
        "--attr",
        "nodes=4",
        "--attr",
        "label=plain text",
        step=1,
    )
    assert result.exit_code == 0, result.output
    path = manifest_path_for(checkpoint)
    assert result.stdout.strip() == str(path)
    m = read_manifest(path)
    assert (m.run, m.step) == ("run1", 1)
    assert m.predicate["seeds"] == (11, 12)
    assert m.predicate["command"] == ("python", "solver.py", "--out", "a dir")
    assert dict(m.predicate["attributes"]) == {"nodes": 4, "label": "plain text"}
    assert run_cli("verify", str(path)).exit_code == 0


def test_snapshot_of_a_dirty_tree_names_the_patch_to_commit_once(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (project.root / "solver.py").write_text("print('solve faster')\n")  # uncommitted
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert result.exit_code == 0, result.output
    digest = read_manifest(manifest_path_for(checkpoint)).record.git.patch_sha256
    assert digest is not None
    name = f".kaudit/patches/{digest}.patch"
    assert (project.root / name).is_file()
    assert [line for line in result.stderr.splitlines() if name in line] == [
        f"kaudit: note: uncommitted changes recorded as {name}: commit it with the "
        "manifests, or `kaudit push` them to the DVC remote, for a replay elsewhere"
    ]


def test_snapshot_with_two_keys_and_no_choice_names_both(
    project: Project, key: SigningKey, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = generate_key("other")
    assert_bad_input(snapshot_cli(checkpoint), "tester", "other", "--key")
    assert leftovers(project.root) == []

    monkeypatch.setenv("KAUDIT_KEY", "other")
    assert snapshot_cli(checkpoint).exit_code == 0
    assert read_manifest(manifest_path_for(checkpoint)).envelope.signatures[0].keyid == (
        other.key_id
    )
    assert snapshot_cli(checkpoint, "--key", "tester", "--force").exit_code == 0  # --key wins
    assert read_manifest(manifest_path_for(checkpoint)).envelope.signatures[0].keyid == (key.key_id)


def test_snapshot_with_no_key_held(project: Project, checkpoint: Path, kaudit_home: Path) -> None:
    assert_bad_input(snapshot_cli(checkpoint), str(kaudit_home / "keys"), "kaudit keys generate")
    assert leftovers(project.root) == []


def test_snapshot_with_a_key_not_held(
    project: Project, key: SigningKey, checkpoint: Path, kaudit_home: Path
) -> None:
    result = snapshot_cli(checkpoint, "--key", "nobody")
    assert_bad_input(result, "'nobody'", str(kaudit_home / "keys"), "held: tester")
    assert leftovers(project.root) == []


def test_snapshot_of_a_missing_checkpoint(project: Project, key: SigningKey) -> None:
    missing = project.root / "checkpoints" / "nope.h5"
    assert_bad_input(snapshot_cli(missing), str(missing), "not found")
    assert leftovers(project.root) == []


def test_snapshot_with_the_second_checkpoint_missing_writes_nothing(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    missing = checkpoint.with_name("rank1.h5")
    result = run_cli("snapshot", str(checkpoint), str(missing), "--run", "r", "--step", "1")
    assert_bad_input(result, str(missing))
    assert not manifest_path_for(checkpoint).exists()
    assert leftovers(project.root) == []
    assert result.stdout == ""


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_snapshot_of_an_unreadable_hdf5_file(
    project: Project, key: SigningKey, checkpoint: Path, damage: str
) -> None:
    content = checkpoint.read_bytes()
    bad = checkpoint.with_name("bad.h5")
    bad.write_bytes(
        content[:8] + b"\x00\xff" * 300 if damage == "garbage" else content[: len(content) // 3]
    )
    assert_bad_input(snapshot_cli(bad), str(bad), "HDF5")
    assert leftovers(project.root) == []


def test_snapshot_outside_a_git_repository(key: SigningKey, tmp_path: Path) -> None:
    loose = write_checkpoint(tmp_path / "loose" / "s.h5")
    assert_bad_input(snapshot_cli(loose), str(loose), "not inside a git repository")
    assert leftovers(tmp_path / "loose") == []


def test_snapshot_in_a_repository_without_init(git_repo: Path) -> None:
    generate_key("k")
    ckpt = write_checkpoint(git_repo / "s.h5")
    assert_bad_input(snapshot_cli(ckpt), str(git_repo), "kaudit init")
    assert leftovers(git_repo) == []


@pytest.mark.parametrize(
    ("run", "step", "mention"),
    [("other", 5, "belongs to run 'run1'"), ("run1", 1, "not before step 1")],
)
def test_snapshot_refuses_a_parent_that_cannot_precede(
    project: Project, key: SigningKey, run: str, step: int, mention: str
) -> None:
    a = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    b = write_checkpoint(project.root / "ck" / "b.h5", seed=2)
    assert snapshot_cli(a, step=3).exit_code == 0
    parent = manifest_path_for(a)
    assert_bad_input(snapshot_cli(b, "--parent", str(parent), step=step, run=run), mention)
    assert leftovers(project.root) == [parent]


def test_snapshot_with_a_parent_that_is_not_a_manifest(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    fake = checkpoint.with_name("fake.kaudit.json")
    fake.write_text('{"payloadType": "application/vnd.in-toto+json", "pay')
    assert_bad_input(snapshot_cli(checkpoint, "--parent", str(fake), step=2), str(fake), "JSON")
    assert leftovers(project.root) == [fake]


@pytest.mark.parametrize(
    ("args", "mention"),
    [
        (("--command", "python 'unclosed"), "--command"),
        (("--attr", "no-equals-sign"), "KEY=VALUE"),
        (("--run", ""), "run id must not be empty"),
    ],
)
def test_snapshot_option_errors(
    project: Project, key: SigningKey, checkpoint: Path, args: tuple[str, ...], mention: str
) -> None:
    result = run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1", *args)
    assert_bad_input(result, mention)
    assert leftovers(project.root) == []


def test_snapshot_refuses_a_negative_step(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    result = snapshot_cli(checkpoint, step=-1)
    assert result.exit_code == 2
    assert "--step" in result.stderr
    assert leftovers(project.root) == []


# -- verify -----------------------------------------------------------------------------


def test_verify_json_reports_every_manifest(project: Project, key: SigningKey) -> None:
    paths: list[Path] = []
    for step in (1, 2, 3):
        ckpt = write_checkpoint(project.root / "ck" / f"s{step}.h5", seed=step)
        parent = ["--parent", str(paths[-1])] if paths else []
        assert snapshot_cli(ckpt, *parent, step=step).exit_code == 0
        paths.append(manifest_path_for(ckpt))
    result = run_cli("verify", "--json", *map(str, paths))
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert set(report) == {"ok", "summary", "results", "errors"}
    assert report["summary"]["data_checked"] == 3
    assert report["ok"] is True
    assert report["errors"] == []
    assert [r["manifest"] for r in report["results"]] == [project.relative(p) for p in paths]
    assert [r["step"] for r in report["results"]] == [1, 2, 3]
    for r in report["results"]:
        assert r["ok"] is True
        assert r["run"] == "run1"
        assert all(c["ok"] for c in r["checks"])

    human = run_cli("verify", str(project.root / "ck"))
    assert human.exit_code == 0
    assert human.stdout.count("ok   ") == 3


def test_verify_with_no_path_covers_every_run_of_the_repository(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    for run in ("a", "b/deeper"):
        ckpt = write_checkpoint(project.root / "checkpoints" / run / "s1.h5")
        assert snapshot_cli(ckpt, run=run.replace("/", "-")).exit_code == 0
    named = run_cli("verify", "checkpoints", cwd=project.root)
    every = run_cli("verify", cwd=project.root)  # as `status`, `push`, `log`, `gate`
    assert every.exit_code == 0, every.output
    assert every.stdout == named.stdout
    assert every.stdout.count("ok   ") == 2
    # from below the root: the text relative to where you are, the JSON to the root, as
    # git's porcelain formats
    below = run_cli("verify", cwd=project.root / "checkpoints" / "a")
    assert "ok   ../b/deeper/s1.h5.kaudit.json" in below.stdout
    below = run_cli("verify", "--json", cwd=project.root / "checkpoints" / "a")
    assert [r["manifest"] for r in json.loads(below.stdout)["results"]] == [
        "checkpoints/a/s1.h5.kaudit.json",
        "checkpoints/b/deeper/s1.h5.kaudit.json",
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_bad_input(run_cli("verify", cwd=empty), str(empty))


def test_verify_truncated_json(project: Project, key: SigningKey, checkpoint: Path) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    m.path.write_bytes(m.path.read_bytes()[:100])
    assert_bad_input(run_cli("verify", str(m.path)), str(m.path), "not valid JSON")


def test_verify_json_that_is_not_an_envelope(project: Project, key: SigningKey) -> None:
    other = project.root / "ck" / "results.h5.kaudit.json"
    other.parent.mkdir()
    other.write_text('{"accuracy": 0.97}\n')
    assert_bad_input(run_cli("verify", str(other)), str(other), "not a DSSE envelope")


def test_verify_a_manifest_whose_checkpoint_is_missing(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    checkpoint.unlink()
    assert m.subject_md5 is not None
    cache_object_path(cache_settings(project)[0], m.subject_md5).unlink()
    # Neither here nor in DVC's cache: verify asks the remote; there is none.
    assert_bad_input(run_cli("verify", str(m.path)), str(checkpoint), "no DVC remote")
    assert not checkpoint.exists()


def test_verify_a_missing_manifest(project: Project) -> None:
    gone = project.root / "gone.h5.kaudit.json"
    assert_bad_input(run_cli("verify", str(gone)), str(gone), "manifest not found")


def test_verify_bad_input_among_good_manifests(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    broken = checkpoint.with_name("broken.h5.kaudit.json")
    broken.write_text("{")
    result = run_cli("verify", str(m.path), str(broken))
    assert_bad_input(result, str(broken))
    assert f"ok   {m.path}" in result.stdout  # the good one is still reported

    as_json = run_cli("verify", "--json", str(m.path), str(broken))
    assert as_json.exit_code == 2
    assert as_json.stderr == ""
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert [r["ok"] for r in report["results"]] == [True]
    (error,) = report["errors"]
    assert error["path"] == str(broken)
    assert "not valid JSON" in error["error"]


# -- show -------------------------------------------------------------------------------


def test_show_summarises_a_manifest(project: Project, key: SigningKey, checkpoint: Path) -> None:
    (m,) = snapshot(checkpoint, run="heat-2d", step=1, seeds=[99], command=["python", "x.py"])
    result = run_cli("show", str(m.path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "heat-2d / 1" in out
    for dataset in ("/fields/u", "/fields/v", "/labels", "/step", "/weights"):
        assert dataset in out
    assert "5 datasets" in out
    assert "99" in out
    assert "python x.py" in out
    assert m.subject_sha256 in out
    assert git(project.root, "rev-parse", "HEAD").strip() in out


def test_show_json_prints_the_statement(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="heat-2d", step=1)
    result = run_cli("show", "--json", str(m.path))
    assert result.exit_code == 0
    statement = json.loads(result.stdout)
    assert statement == json.loads(m.envelope.payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"]["run"] == "heat-2d"
    assert statement["subject"][0]["name"] == "checkpoints/run1/step-00000001.h5"


def test_show_of_a_non_hdf5_checkpoint(project: Project, key: SigningKey) -> None:
    blob = project.root / "model.raw"
    blob.write_bytes(b"\x00" * 100)
    (m,) = snapshot(blob, run="r", step=0)
    result = run_cli("show", str(m.path))
    assert result.exit_code == 0
    assert "not HDF5: covered by the file digest only" in result.stdout


def test_show_of_a_pickle_says_ok_is_not_safe_to_load(project: Project, key: SigningKey) -> None:
    blob = project.root / "model.pt"  # by its name; kaudit never unpickles it
    blob.write_bytes(b"\x00" * 100)
    (m,) = snapshot(blob, run="r", step=0)
    result = run_cli("show", str(m.path))
    assert result.exit_code == 0
    assert "a pickle: covered by the file digest only; ok does not mean safe to load" in (
        " ".join(result.stdout.split())
    )


def test_show_bad_input(tmp_path: Path) -> None:
    junk = tmp_path / "x.kaudit.json"
    junk.write_text("[]")
    assert_bad_input(run_cli("show", str(junk)), str(junk), "not a DSSE envelope")


# -- the installed entry point, as a subprocess -----------------------------------------


def kaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # KAUDIT_HOME and the git identity come from the autouse fixture's environment.
    assert os.environ["KAUDIT_HOME"]
    return subprocess.run(
        [*KAUDIT, *args], cwd=cwd, env=dict(os.environ), capture_output=True, text=True
    )


@pytest.mark.slow  # five interpreter starts, one of them importing DVC
def test_round_trip_through_the_console_script(git_repo: Path, kaudit_home: Path) -> None:
    init = kaudit("init", cwd=git_repo)
    assert init.returncode == 0, init.stderr
    generated = kaudit("keys", "generate", cwd=git_repo)
    assert generated.returncode == 0, generated.stderr
    assert (kaudit_home / "keys" / "default.key").is_file()
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-q", "-m", "kaudit init")

    first = write_checkpoint(git_repo / "ck" / "s1.h5", seed=1)
    second = write_checkpoint(git_repo / "ck" / "s2.h5", seed=2)
    snap = kaudit("snapshot", "ck/s1.h5", "--run", "r", "--step", "1", cwd=git_repo)
    assert snap.returncode == 0, snap.stderr
    assert snap.stdout.strip() == "ck/s1.h5.kaudit.json"
    snap = kaudit(
        "snapshot", "ck/s2.h5", "--run", "r", "--step", "2", "--parent", "ck/s1.h5.kaudit.json",
        cwd=git_repo,
    )  # fmt: skip
    assert snap.returncode == 0, snap.stderr

    ok = kaudit("verify", "--json", "ck", cwd=git_repo)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["ok"] is True
    assert len(report["results"]) == 2

    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    failed = kaudit("verify", "ck/s1.h5.kaudit.json", "ck/s2.h5.kaudit.json", cwd=git_repo)
    assert failed.returncode == 1
    assert "file digest" in failed.stdout
    assert "Traceback" not in failed.stderr
    assert second.exists()


def test_bad_input_through_the_console_script(project: Project, key: SigningKey) -> None:
    bad = project.root / "bad.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x07" * 1000)
    result = kaudit("snapshot", "bad.h5", "--run", "r", "--step", "1", cwd=project.root)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # Nothing else on stderr: no HDF5 library diagnostics either.
    (line,) = result.stderr.splitlines()
    assert line.startswith("kaudit: error: bad.h5: not a readable HDF5 file")
    assert result.stdout == ""
    assert leftovers(project.root) == []

    gone = kaudit("verify", "missing.h5.kaudit.json", cwd=project.root)
    assert gone.returncode == 2
    assert gone.stderr.splitlines() == ["kaudit: error: missing.h5.kaudit.json: manifest not found"]


def test_keys_generate_refused_by_a_trust_store_name_clash_leaves_no_key(
    project: Project, kaudit_home: Path
) -> None:
    other = generate_key("colleague")
    project.trust_store().add(other.private_key.public_key(), "mine")
    (kaudit_home / "keys" / "colleague.key").unlink()
    result = run_cli("keys", "generate", "--name", "mine", cwd=project.root)
    assert_bad_input(result, "mine")
    assert not (kaudit_home / "keys" / "mine.key").exists()


def test_a_manifest_that_cannot_be_written_is_one_line(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    manifest_path_for(checkpoint).mkdir()  # something in the way of the manifest
    result = snapshot_cli(checkpoint)
    assert_bad_input(result, "cannot write manifest")
    assert [p for p in leftovers(project.root) if p.is_file()] == []


def test_snapshot_of_a_checkpoint_git_tracks_is_refused(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    git(project.root, "add", "-f", str(checkpoint))
    result = run_cli("snapshot", str(checkpoint), "--run", "r", "--step", "1", cwd=project.root)
    assert_bad_input(result, "tracked by git", "git rm --cached")
    assert leftovers(project.root) == []
    assert not checkpoint.with_name(checkpoint.name + ".dvc").exists()
