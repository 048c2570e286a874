"""What a command says it did is what happened: verify counts ok, failed and errors apart,
names where the data is in the words ``kaudit status`` uses, says the advice for an
unanchored signer once and an anchor's path once; push says what it uploaded, what the
remote had and which files were one object."""

from __future__ import annotations

import json
from pathlib import Path

from kronos_audit.keys.anchors import UNANCHORED_ADVICE
from kronos_audit.keys.home import user_trust_dir
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.storage import configure_remote
from tests.helpers import run_cli, untrusted_key, write_checkpoint


def _chain(project: Project, key: SigningKey, steps: int, *, same: bool = False) -> Path:
    """A run of ``steps`` checkpoints signed by ``key`` (the same bytes each, if ``same``)."""
    run = project.root / "checkpoints" / "r"
    parent = None
    for step in range(1, steps + 1):
        ckpt = write_checkpoint(run / f"step-{step}.h5", seed=0 if same else step, n=8)
        (m,) = snapshot(ckpt, run="r", step=step, key=key, parent=parent)
        parent = m.path
    return run


def test_an_unanchored_clone_without_data_counts_failures_and_errors_apart(
    project: Project,
) -> None:
    # As a fresh clone: signed by a key only the repository's store holds, no data here,
    # and a manifest that is not one.
    stranger = untrusted_key("stranger")
    project.trust_store().add(stranger.private_key.public_key(), "stranger")
    run = _chain(project, stranger, 3)
    for ckpt in run.glob("*.h5"):
        ckpt.unlink()
    (run / "step-9.h5.kaudit.json").write_text("{not json")

    text = run_cli("verify", cwd=run)
    assert text.exit_code == 2  # bad input outranks the failed checks
    lines = text.stdout.splitlines()
    assert lines[-1] == "3 manifest(s): 3 failed; data not checked for 3 (missing); 1 error(s)"
    assert "pruned" not in text.stdout
    assert "verified" not in text.stdout
    # the advice once, at the end, not on each manifest's lines
    assert text.stdout.count(UNANCHORED_ADVICE) == 1
    assert lines[-2] == f"unanchored: {UNANCHORED_ADVICE}"
    assert text.stdout.count("(unanchored)") == 5  # 3 signatures, 2 parent links
    assert "step-9.h5.kaudit.json: not valid JSON" in text.stderr

    doc = json.loads(run_cli("verify", "--json", cwd=run).stdout)
    summary = doc["summary"]
    assert (summary["ok"], summary["failed"], summary["errors"]) == (0, 3, 1)
    assert summary["data"] == {"missing": 3} == summary["not_checked"]
    assert len(doc["errors"]) == 1
    # JSON keeps each refusal whole, advice included: a script reads one result alone
    assert doc["results"][0]["checks"][0]["detail"].endswith(UNANCHORED_ADVICE)


def test_ok_lines_name_the_anchor_and_its_path_is_said_once(
    project: Project, key: SigningKey
) -> None:
    run = _chain(project, key, 3)
    store = str(user_trust_dir() / "tester.pub")
    text = run_cli("verify", cwd=run)
    assert text.exit_code == 0, text.output
    oks = [line for line in text.stdout.splitlines() if line.startswith("ok   ")]
    assert len(oks) == 3
    assert all(line.endswith("anchor: user trust store)") for line in oks), oks
    assert text.stdout.count(store) == 1
    assert text.stdout.splitlines()[-1] == "3 manifest(s): 3 ok; data checked for 3"
    verbose = run_cli("verify", "-v", cwd=run)
    oks = [line for line in verbose.stdout.splitlines() if line.startswith("ok   ")]
    assert all(line.endswith(f"anchor: user trust store ({store}))") for line in oks), oks


def test_a_first_push_says_which_files_were_one_object(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run = _chain(project, key, 3, same=True)  # three files, one content
    configure_remote(project, str(tmp_path / "remote"))
    first = run_cli("push", cwd=run)
    assert first.exit_code == 0, first.output
    assert "pushed 3 checkpoint(s): 1 object(s) uploaded, 3 identical files stored as 1 " in (
        first.stdout
    )
    assert "already" not in first.stdout
    again = run_cli("push", cwd=run)
    assert "0 object(s) uploaded, 1 in the remote already" in again.stdout
