"""Text output names files as git does: relative to where one stands, whichever command
prints them and however they were given (relative, absolute, or found by the command);
``--json`` stays relative to the repository's top (tests/cli/test_json_paths.py)."""

from __future__ import annotations

import json
from pathlib import Path

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.storage import configure_remote
from tests.helpers import run_cli, write_checkpoint

CKPT = "../checkpoints/r/step-1.h5"
MANIFEST = f"{CKPT}.kaudit.json"


def test_every_command_names_files_from_the_working_directory(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    ckpt = write_checkpoint(project.root / "checkpoints" / "r" / "step-1.h5", n=8)
    (m,) = snapshot(ckpt, run="r", step=1, key=key, cwd=project.root)
    configure_remote(project, str(tmp_path / "remote"))
    sub = project.root / "sub"
    sub.mkdir()
    absolute = str(m.path)  # given absolutely: named from here all the same

    def text(*args: str, code: int = 0) -> str:
        result = run_cli(*args, cwd=sub)
        assert result.exit_code == code, result.output
        assert str(project.root) not in result.output, result.output
        return result.output

    assert f"ok   {MANIFEST}  (run r" in text("verify", absolute)
    assert f"ok   {MANIFEST}  (run r" in text("verify")  # found by the command
    assert f"\n{CKPT}     1" in text("status")
    assert "run r  ../checkpoints/r\n" in text("log")
    shown = text("show", absolute).splitlines()
    assert shown[0] == f"manifest     {MANIFEST}"
    assert shown[1].startswith(f"checkpoint   {CKPT}  (")  # the name it records, from here
    assert "pushed 1 checkpoint(s)" in text("push", absolute)
    assert f"ok   {CKPT} (here)" in text("pull", absolute)
    other = write_checkpoint(ckpt.with_name("step-2.h5"), seed=2, n=8)
    assert f"A: {CKPT} (reference)   B: ../checkpoints/r/step-2.h5\n" in text(
        "diff", absolute, str(other), code=1
    )
    # an error names its file from here too
    missing = str(project.root / "checkpoints" / "r" / "step-9.h5.kaudit.json")
    assert f"kaudit: error: {CKPT[:-4]}9.h5.kaudit.json: manifest not found" in text(
        "replay", missing, code=2
    )
    signed = text("snapshot", str(other), "--run", "r", "--step", "2", "--parent", absolute)
    assert signed.splitlines()[0] == "../checkpoints/r/step-2.h5.kaudit.json"

    # JSON: relative to the top, as before
    doc = json.loads(run_cli("verify", "--json", absolute, cwd=sub).output)
    assert doc["results"][0]["manifest"] == "checkpoints/r/step-1.h5.kaudit.json"


def test_a_file_outside_the_work_tree_is_named_absolutely(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    missing = tmp_path / "elsewhere" / "none.h5.kaudit.json"
    result = run_cli("show", str(missing), cwd=here)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"kaudit: error: {missing}: ")
