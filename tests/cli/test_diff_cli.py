"""`kaudit diff` (kronos_audit.cli.commands.diff): output, exit codes, tolerances from
options and from .kaudit/config.toml, --json against the schema, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.schemas import validate
from tests.helpers import assert_bad_input, run_cli, write_checkpoint


def perturbed(src: Path, dst: Path, *, rel: float = 1e-13, counts_delta: int = 0) -> Path:
    """A copy of checkpoint ``src`` whose float fields differ by about ``rel``."""
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        g["fields/u"] = f["fields/u"][...] * (1 + rel)
        g["fields/v"] = f["fields/v"][...]
        g.create_dataset("weights", data=f["weights"][...] + counts_delta, chunks=(8, 8))
        g["step"] = f["step"][()]
        g["labels"] = np.array(["alpha", "beta"], dtype=h5py.string_dtype())
    return dst


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    a = write_checkpoint(tmp_path / "a.h5", seed=1)
    return a, perturbed(a, tmp_path / "b.h5")


def test_identical_checkpoints_exit_0_with_one_line(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.h5", seed=1)
    b = write_checkpoint(tmp_path / "b.h5", seed=1)
    r = run_cli("diff", str(a), str(b))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "ok: 5 datasets: 5 identical"


def test_differences_exit_1_with_a_table_of_the_non_identical(files: tuple[Path, Path]) -> None:
    a, b = files
    r = run_cli("diff", str(a), str(b))
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert "/fields/u" in out
    assert "DIFFERENT" in out
    assert "/fields/v" not in out  # identical datasets are not listed
    assert "first [" in out
    assert "worst [" in out
    assert "rule: default (exact)" in out
    assert out.strip().splitlines()[-1] == ("FAIL: 5 datasets: 4 identical, 1 different")


def test_a_tolerance_makes_it_pass(files: tuple[Path, Path]) -> None:
    a, b = files
    for args in (["--rtol", "1e-12"], ["--atol", "1e-11"], ["--tol", "fields/*:rtol=1e-12"]):
        r = run_cli("diff", str(a), str(b), *args)
        assert r.exit_code == 0, (args, r.output)
        assert "WITHIN_TOLERANCE" in r.stdout
        assert r.stdout.strip().splitlines()[-1] == (
            "ok: 5 datasets: 4 identical, 1 within tolerance"
        )
    # too tight, or the wrong datasets named
    assert run_cli("diff", str(a), str(b), "--rtol", "1e-15").exit_code == 1
    assert run_cli("diff", str(a), str(b), "--tol", "weights:atol=1").exit_code == 1


def test_ulp_option(tmp_path: Path) -> None:
    x = np.linspace(1, 2, 100)
    y = np.nextafter(np.nextafter(x, 3), 3)  # 2 ULPs up
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    with h5py.File(a, "w") as f:
        f["x"] = x
    with h5py.File(b, "w") as f:
        f["x"] = y
    assert run_cli("diff", str(a), str(b), "--ulp", "2").exit_code == 0
    r = run_cli("diff", str(a), str(b), "--ulp", "1")
    assert r.exit_code == 1
    assert "100 (100%)" in r.stdout


def test_first_matching_tol_wins_and_integers_need_naming(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.h5", seed=1)
    b = perturbed(a, tmp_path / "b.h5", counts_delta=1)
    # the global rtol does not reach integer data
    r = run_cli("diff", str(a), str(b), "--rtol", "1e-12")
    assert r.exit_code == 1
    assert "/weights" in r.stdout
    assert "integer data (exact)" in r.stdout
    ok = run_cli("diff", str(a), str(b), "--rtol", "1e-12", "--tol", "weights:atol=1")
    assert ok.exit_code == 0, ok.output
    # first match wins: exact for fields/u even though a later pattern would pass it
    r = run_cli("diff", str(a), str(b), "--tol", "fields/u:exact", "--tol", "*:rtol=1e-3,atol=1")
    assert r.exit_code == 1
    assert "rule: --tol fields/u:exact" in r.stdout


def test_only_in_and_not_comparable_fail_whatever_the_tolerance(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.h5", seed=1)
    b = write_checkpoint(tmp_path / "b.h5", seed=1)
    with h5py.File(b, "a") as f:
        del f["step"]
        f["extra"] = np.ones(3)
        del f["fields/v"]
        f["fields/v"] = np.ones(5)
    r = run_cli("diff", str(a), str(b), "--rtol", "1", "--atol", "1e300")
    assert r.exit_code == 1
    for text in ("ONLY_IN_A", "ONLY_IN_B", "NOT_COMPARABLE", "/step", "/extra", "/fields/v"):
        assert text in r.stdout
    assert "missing from B" in r.stdout
    assert "missing from A" in r.stdout
    assert "shape (64, 64) in A, (5,) in B" in r.stdout


# -- tolerances from .kaudit/config.toml ---------------------------------------------------


def config(project: Project, compare: str) -> None:
    project.config_path.write_text("[kaudit]\nconfig_version = 1\n\n[compare]\n" + compare)


def test_config_tolerances_apply_and_options_override(project: Project) -> None:
    ckpt = project.root / "checkpoints"
    a = write_checkpoint(ckpt / "a.h5", seed=1)
    b = perturbed(a, ckpt / "b.h5", counts_delta=1)
    assert run_cli("diff", str(a), str(b), cwd=project.root).exit_code == 1

    config(project, 'rtol = 1e-12\ntol = ["weights:atol=1"]\n')
    r = run_cli("diff", "checkpoints/a.h5", "checkpoints/b.h5", cwd=project.root)
    assert r.exit_code == 0, r.output
    assert "(tolerances: [compare] of the work tree's .kaudit/config.toml" in r.stdout
    assert "config.toml" in r.stdout
    assert "rule: config weights:rtol=0,atol=1" in r.stdout
    assert "rule: global rtol=1e-12,atol=0" in r.stdout

    # the command line overrides the config: key by key, and its --tol rules come first
    assert run_cli("diff", str(a), str(b), "--rtol", "0", cwd=project.root).exit_code == 1
    r = run_cli("diff", str(a), str(b), "--tol", "weights:exact", cwd=project.root)
    assert r.exit_code == 1
    assert "rule: --tol weights:exact" in r.stdout
    # the config is found from the files' location, not the working directory
    assert run_cli("diff", str(a), str(b), cwd=project.root.parent).exit_code == 0


def test_bad_config_is_bad_input(project: Project) -> None:
    a = write_checkpoint(project.root / "a.h5", seed=1)
    config(project, 'tol = ["fields/*:rtol=oops"]\n')
    r = run_cli("diff", str(a), str(a))
    assert_bad_input(r, "config.toml", "[compare] tol[0]", "rtol must be a number")
    config(project, "rtl = 1e-3\n")
    assert_bad_input(run_cli("diff", str(a), str(a)), "unknown key 'rtl'")


# -- --json ------------------------------------------------------------------------------


def test_json_validates_and_holds_everything(files: tuple[Path, Path]) -> None:
    a, b = files
    r = run_cli("diff", str(a), str(b), "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    validate(doc, schema_name="comparison-v1.schema.json")
    assert doc["ok"] is False
    assert doc["config"] is None
    assert [d["path"] for d in doc["datasets"]] == [
        "/fields/u",
        "/fields/v",
        "/labels",
        "/step",
        "/weights",
    ]
    u = doc["datasets"][0]
    assert u["verdict"] == "DIFFERENT"
    assert u["first_mismatch"]["index"] == [0, 0]
    assert u["tolerance"] is None
    r = run_cli("diff", str(a), str(b), "--json", "--rtol", "1e-12", "--tol", "step:exact")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    validate(doc, schema_name="comparison-v1.schema.json")
    assert doc["policy"]["default"] == {"rtol": 1e-12, "atol": 0.0, "ulp": None}
    assert doc["policy"]["rules"] == [{"pattern": "step", "tolerance": None, "origin": "--tol"}]
    assert doc["counts"]["WITHIN_TOLERANCE"] == 1


def test_json_with_config(project: Project) -> None:
    a = write_checkpoint(project.root / "a.h5", seed=1)
    config(project, "atol = 1e-9\n")
    r = run_cli("diff", str(a), str(a), "--json")
    doc = json.loads(r.stdout)
    validate(doc, schema_name="comparison-v1.schema.json")
    assert doc["config"] == ".kaudit/config.toml"
    assert doc["policy"]["default"]["atol"] == 1e-9


# -- bad input ---------------------------------------------------------------------------


def test_bad_files_exit_2_with_one_line(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a.h5", seed=1)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert_bad_input(run_cli("diff", str(a), str(tmp_path / "nope.h5")), "nope.h5", "not found")
    assert_bad_input(run_cli("diff", str(tmp_path / "nope.h5"), str(a)), "nope.h5", "not found")
    assert_bad_input(run_cli("diff", str(a), str(text)), "notes.txt", "not an HDF5 file")
    assert_bad_input(run_cli("diff", str(a), str(tmp_path)), "is a directory")
    # with --json, the same error as one JSON object on stdout, nothing on stderr
    as_json = run_cli("diff", str(a), str(text), "--json")
    assert as_json.exit_code == 2
    assert as_json.stderr == ""
    error = json.loads(as_json.stdout)
    assert "not an HDF5 file" in error["error"]
    assert (error["path"], error["exit_code"]) == (str(text), 2)


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--tol", "fields/*"], ["--tol 'fields/*'", "PATTERN:SPEC"]),
        (["--tol", "fields/*:rtol=abc"], ["--tol 'fields/*:rtol=abc'", "rtol must be a number"]),
        (["--tol", "x:foo=1"], ["unknown key 'foo'"]),
        (["--tol", "ok:exact", "--tol", "x:ulp=0.5"], ["--tol 'x:ulp=0.5'", "whole number"]),
        (["--rtol", "abc"], ["--rtol must be a number, got 'abc'"]),
        (["--atol", "-1"], ["--atol", "not negative"]),
        (["--ulp", "1.5"], ["--ulp must be a whole number"]),
        (["--rtol", "inf"], ["--rtol", "finite"]),
    ],
)
def test_malformed_tolerances_exit_2_with_one_line(
    files: tuple[Path, Path], args: list[str], mentions: list[str]
) -> None:
    a, b = files
    assert_bad_input(run_cli("diff", str(a), str(b), *args), *mentions)


def test_malformed_tol_is_reported_before_reading_files(tmp_path: Path) -> None:
    r = run_cli("diff", str(tmp_path / "x.h5"), str(tmp_path / "y.h5"), "--tol", "bad")
    assert_bad_input(r, "--tol 'bad'")


# -- the installed entry point -------------------------------------------------------------


def test_diff_through_the_console_script(files: tuple[Path, Path]) -> None:
    a, b = files
    cmd = [sys.executable, "-c", "from kronos_audit.cli import main; main()", "diff"]
    run = subprocess.run([*cmd, str(a), str(b)], capture_output=True, text=True, check=False)
    assert run.returncode == 1, run.stderr
    assert "DIFFERENT" in run.stdout
    run = subprocess.run(
        [*cmd, str(a), str(b), "--rtol", "1e-12", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    validate(json.loads(run.stdout), schema_name="comparison-v1.schema.json")
    bad = subprocess.run(
        [*cmd, str(a), str(b), "--tol", "x:rtol=?"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "kaudit: error: --tol 'x:rtol=?': rtol must be a number, got '?'"
    ]


def test_an_empty_compare_section_is_not_named_as_the_tolerances(project: Project) -> None:
    ckpt = project.root / "checkpoints"
    a = write_checkpoint(ckpt / "a.h5", seed=1)
    b = write_checkpoint(ckpt / "b.h5", seed=1)
    config(project, "# rtol = 1e-12\n")  # [compare] there, every value commented out
    r = run_cli("diff", str(a), str(b), cwd=project.root)
    assert r.exit_code == 0, r.output
    assert r.stdout == "ok: 5 datasets: 5 identical\n"
    doc = json.loads(run_cli("diff", str(a), str(b), "--json", cwd=project.root).stdout)
    assert doc["tolerance_source"]["settings"] == "none"


def test_manifests_name_their_checkpoints(project: Project, key: SigningKey) -> None:
    ckpt = project.root / "checkpoints" / "r"
    a = write_checkpoint(ckpt / "step-1.h5", seed=1)
    b = perturbed(a, ckpt / "step-2.h5")
    for step, c in ((1, a), (2, b)):
        snapshot(c, run="r", step=step, key=key)
    by_manifest = run_cli("diff", "step-1.h5.kaudit.json", "step-2.h5.kaudit.json", cwd=ckpt)
    by_file = run_cli("diff", "step-1.h5", "step-2.h5", cwd=ckpt)
    assert by_manifest.exit_code == 1, by_manifest.output
    assert by_manifest.stdout == by_file.stdout
    mixed = run_cli("diff", "step-1.h5.kaudit.json", "step-1.h5", cwd=ckpt)
    assert mixed.exit_code == 0, mixed.output
