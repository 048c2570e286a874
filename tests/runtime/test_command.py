"""The command line a manifest records: credentials never signed, committed or pushed."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.secrets import scrub_command
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli, write_checkpoint

PROGRAM = """
import sys
import numpy as np
import kronos_audit as ka

declared = sys.argv[1] == "declared"
command = ["python", "train.py", "--api-key-env", "TRAIN_API_KEY"] if declared else None
with ka.Run("train", root="checkpoints", seed=1, every=ka.EverySteps(1), command=command) as run:
    for step in run.steps(1):
        run.checkpoint(step, {"w": np.arange(4.0)})
"""

SECRETS = ("s3cr3t-api-value", "hunter2", "tok-1234567890", "ghp_abcdefghijklmnopqrstuvwx")


def _run(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    (project.root / "train.py").write_text(PROGRAM)
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_credentials_in_argv_are_recorded_as_stars_and_said(
    project: Project, key: SigningKey
) -> None:
    done = _run(
        project,
        "argv",
        f"--api-key={SECRETS[0]}",
        "--remote",
        f"https://alice:{SECRETS[1]}@data.example.org/bucket",
        "--token",
        SECRETS[2],
        SECRETS[3],
        "--tokenizer",
        "gpt2",
    )
    assert done.returncode == 0, done.stderr
    manifest = project.root / "checkpoints" / "train" / "step-00000001.h5.kaudit.json"
    m = ka.read_manifest(manifest)
    assert list(m.predicate["command"]) == [
        "python",
        "train.py",
        "argv",
        "--api-key=***",
        "--remote",
        "https://***:***@data.example.org/bucket",
        "--token",
        "***",
        "***",
        "--tokenizer",
        "gpt2",  # a word that only starts like one is kept
    ]
    # Not in the signed payload (base64 in the envelope), nor in any file that git or DVC
    # would carry.
    payload = base64.b64decode(json.loads(manifest.read_text())["payload"])
    for secret in SECRETS:
        assert secret.encode() not in payload, secret
    for path in (project.root / "checkpoints").rglob("*"):
        if path.is_file():
            for secret in SECRETS:
                assert secret.encode() not in path.read_bytes(), (path, secret)
    assert "looks like credentials" in done.stderr
    assert "--api-key" in done.stderr
    for secret in SECRETS:
        assert secret not in done.stderr  # the warning names the option, never the value
    assert ka.verify(manifest)[0].ok


def test_a_program_declares_the_command_to_record(project: Project, key: SigningKey) -> None:
    done = _run(project, "declared", f"--api-key={SECRETS[0]}")
    assert done.returncode == 0, done.stderr
    m = ka.read_manifest(project.root / "checkpoints" / "train" / "step-00000001.h5.kaudit.json")
    assert list(m.predicate["command"]) == ["python", "train.py", "--api-key-env", "TRAIN_API_KEY"]
    assert "looks like credentials" not in done.stderr


def test_a_declared_command_must_be_an_argv(project: Project, key: SigningKey) -> None:
    with pytest.raises(UsageError, match="list of strings"):
        ka.Run("x", root=project.root / "checkpoints", command="python train.py")


@pytest.mark.parametrize(
    ("argv", "recorded"),
    [
        (["--password", "pw", "--lr", "0.1"], ["--password", "***", "--lr", "0.1"]),
        (["db.password=pw", "optimizer.lr=0.1"], ["db.password=***", "optimizer.lr=0.1"]),
        (["--secret-key=abc", "--keep", "3"], ["--secret-key=***", "--keep", "3"]),
        (["--token", "--verbose"], ["--token", "--verbose"]),  # a flag, no value taken
        (["s3://bucket/x?X-Amz-Signature=abc"], ["s3://bucket/x?X-Amz-Signature=***"]),
        (
            ["git@github.com:org/repo", "./data/a@b.h5"],
            ["git@github.com:org/repo", "./data/a@b.h5"],
        ),
    ],
)
def test_scrub_rules(argv: list[str], recorded: list[str]) -> None:
    assert list(scrub_command(argv).argv) == recorded


def test_manifest_bytes_hold_no_secret_of_a_url(tmp_path: Path) -> None:
    scrubbed = scrub_command(["https://user:pa%40ss@h/x"])
    assert "pa%40ss" not in " ".join(scrubbed.argv)
    assert "pa@ss" not in " ".join(scrubbed.argv)


def test_a_url_inside_an_options_value_is_recorded_without_its_credentials(
    project: Project, key: SigningKey
) -> None:
    done = _run(
        project,
        "argv",
        f"--data=https://bob:{SECRETS[1]}@data.example.org/set",
        f"sources=s3://bucket/a,https://{SECRETS[3]}@mirror.example.org/b",
        "--out=s3://bucket/results",
    )
    assert done.returncode == 0, done.stderr
    manifest = project.root / "checkpoints" / "train" / "step-00000001.h5.kaudit.json"
    assert list(ka.read_manifest(manifest).predicate["command"])[3:] == [
        "--data=https://***:***@data.example.org/set",
        "sources=s3://bucket/a,https://***@mirror.example.org/b",
        "--out=s3://bucket/results",  # no credential: kept as it is
    ]
    payload = base64.b64decode(json.loads(manifest.read_text())["payload"])
    for secret in (SECRETS[1], SECRETS[3]):
        assert secret.encode() not in payload, secret
        assert secret not in done.stderr
    assert "argument 3 (a URL's credentials)" in done.stderr


def test_a_declared_command_is_recorded_without_a_urls_credentials(
    project: Project, key: SigningKey, caplog: pytest.LogCaptureFixture
) -> None:
    root = project.root / "checkpoints"
    declared = ["python", "train.py", f"--data=https://bob:{SECRETS[1]}@data.example/set"]
    with ka.Run("d", root=root, seed=1, asynchronous=False, command=declared) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"w": np.arange(4.0)})
    m = ka.read_manifest(root / "d" / "step-00000001.h5.kaudit.json")
    assert list(m.predicate["command"]) == [
        "python",
        "train.py",
        "--data=https://***:***@data.example/set",
    ]
    assert "URL's credentials" in caplog.text
    assert SECRETS[1] not in caplog.text

    checkpoint = write_checkpoint(project.root / "snap" / "step-00000001.h5")
    result = run_cli(
        "snapshot",
        str(checkpoint),
        "--run",
        "snap",
        "--step",
        "1",
        "--command",
        f"python fit.py --remote https://alice:{SECRETS[1]}@host.example/x",
    )
    assert result.exit_code == 0, result.output
    recorded = ka.read_manifest(manifest_path_for(checkpoint)).predicate["command"]
    assert list(recorded)[-1] == "https://***:***@host.example/x"
    payload = json.loads(manifest_path_for(checkpoint).read_text())["payload"]
    assert SECRETS[1].encode() not in base64.b64decode(payload)
