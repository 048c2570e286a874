"""Environment drift: which differences from the recorded lock count, and which are noted."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from kronos_audit.replay import EnvMode, environment_report
from kronos_audit.replay.environment import current_environment, differences
from kronos_audit.statement.predicate import EnvironmentLock

LOCK: dict[str, Any] = {
    "python": {"version": "3.11.7", "implementation": "CPython", "executable": "/venv/bin/python"},
    "platform": {"system": "Linux", "release": "6.1.0", "machine": "x86_64", "libc": "glibc-2.36"},
    "cpu": {"model": "AMD EPYC 7B13", "count": 2},
    "blas": {"name": "scipy-openblas", "version": "0.3.27"},
    "variables": {"OMP_NUM_THREADS": "1"},
    "packages": {"h5py": "3.11.0", "kronos-audit": "0.1.0", "numpy": "2.0.1"},
    "digest": "a" * 64,
}


def changed(**edits: Any) -> dict[str, Any]:
    lock = copy.deepcopy(LOCK)
    for dotted, value in edits.items():
        section, _, name = dotted.partition("__")
        if value is None:
            del lock[section][name]
        else:
            lock[section][name] = value
    lock["digest"] = "b" * 64
    return lock


def test_the_same_lock_has_no_difference() -> None:
    report = environment_report(LOCK, current=copy.deepcopy(LOCK))
    assert report.differences == ()
    assert report.mode is EnvMode.WARN


@pytest.mark.parametrize(
    ("edit", "section", "name"),
    [
        ({"python__executable": "/usr/bin/python3"}, "python", "executable"),
        ({"platform__release": "6.5.0"}, "platform", "release"),
        ({"packages__kronos-audit": "0.2.0"}, "packages", "kronos-audit"),
    ],
)
def test_noted_but_not_drift(edit: dict[str, Any], section: str, name: str) -> None:
    report = environment_report(LOCK, current=changed(**edit))
    assert report.drift == ()
    ((note),) = report.notes
    assert (note.section, note.name, note.change) == (section, name, "changed")
    assert report.to_json_obj()["notes"][0]["drift"] is False


@pytest.mark.parametrize(
    ("edit", "text"),
    [
        ({"python__version": "3.12.1"}, "python version 3.11.7 -> 3.12.1"),
        ({"python__implementation": "PyPy"}, "python implementation CPython -> PyPy"),
        ({"platform__machine": "aarch64"}, "platform machine x86_64 -> aarch64"),
        ({"platform__libc": "glibc-2.39"}, "platform libc glibc-2.36 -> glibc-2.39"),
        ({"cpu__model": "Intel Xeon"}, "cpu model AMD EPYC 7B13 -> Intel Xeon"),
        ({"cpu__count": 8}, "cpu count 2 -> 8"),
        ({"blas__name": "mkl"}, "blas name scipy-openblas -> mkl"),
        ({"variables__OMP_NUM_THREADS": "4"}, "OMP_NUM_THREADS 1 -> 4"),
        ({"variables__OMP_NUM_THREADS": None}, "OMP_NUM_THREADS 1 removed"),
        ({"variables__MKL_CBWR": "AVX2"}, "MKL_CBWR AVX2 added"),
        ({"packages__numpy": "1.26.4"}, "numpy 2.0.1 -> 1.26.4"),
        ({"packages__h5py": None}, "h5py 3.11.0 removed"),
        ({"packages__scipy": "1.14.0"}, "scipy 1.14.0 added"),
    ],
)
def test_drift(edit: dict[str, Any], text: str) -> None:
    report = environment_report(LOCK, EnvMode.STRICT, current=changed(**edit))
    (d,) = report.drift
    assert str(d) == text
    assert report.notes == ()
    assert report.to_json_obj()["drift"][0]["drift"] is True


def test_differences_are_sorted_and_each_is_reported_once() -> None:
    current = changed(packages__numpy="1.26.4", variables__OMP_NUM_THREADS="2")
    current["python"]["executable"] = "/elsewhere/python"
    found = differences(LOCK, current)
    assert [(d.section, d.name) for d in found] == [
        ("python", "executable"),
        ("variables", "OMP_NUM_THREADS"),
        ("packages", "numpy"),
    ]


def test_this_process_matches_its_own_lock_and_reads_variables_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    lock = current_environment()
    assert environment_report(lock).differences == ()
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    (d,) = environment_report(lock).drift
    assert (d.name, d.change, d.current) == ("OMP_NUM_THREADS", "added", "7")


def test_the_typed_lock_of_a_manifest_reports_as_its_json_form() -> None:
    lock = EnvironmentLock.from_json_obj(LOCK)
    current = changed(packages__numpy="1.26.4", platform__release="6.5.0")
    typed = environment_report(lock, EnvMode.STRICT, current=current)
    assert typed == environment_report(LOCK, EnvMode.STRICT, current=current)
    assert [str(d) for d in typed.drift] == ["numpy 2.0.1 -> 1.26.4"]
    assert environment_report(lock, current=lock).differences == ()


# -- frameworks ------------------------------------------------------------------------

TORCH = {
    "version": "2.13.0+cpu",
    "cuda": None,
    "cudnn": None,
    "deterministic_algorithms": True,
    "cudnn_deterministic": False,
    "cudnn_benchmark": False,
    "float32_matmul_precision": "highest",
    "num_threads": 2,
    "cublas_workspace_config": ":4096:8",
}
JAX = {
    "version": "0.10.2",
    "jaxlib": "0.10.2",
    "backend": "cpu",
    "x64": False,
    "devices": {"cpu": 1},
}


def with_frameworks(**frameworks: dict[str, Any]) -> dict[str, Any]:
    lock = copy.deepcopy(LOCK)
    lock["frameworks"] = copy.deepcopy(frameworks)
    return lock


@pytest.mark.parametrize(
    ("torch_edit", "jax_edit", "text"),
    [
        ({"version": "2.5.1"}, {}, "frameworks torch.version 2.13.0+cpu -> 2.5.1"),
        ({"cuda": "12.4"}, {}, "frameworks torch.cuda 12.4 added"),
        ({"cublas_workspace_config": None}, {}, "frameworks torch.cublas_workspace_config"),
        ({}, {"backend": "gpu"}, "frameworks jax.backend cpu -> gpu"),
        ({}, {"devices": {"cpu": 2}}, "frameworks jax.devices.cpu 1 -> 2"),
        ({}, {"devices": {"gpu": 1}}, "frameworks jax.devices.cpu 1 removed"),
    ],
)
def test_framework_drift(torch_edit: dict[str, Any], jax_edit: dict[str, Any], text: str) -> None:
    recorded = with_frameworks(torch=TORCH, jax=JAX)
    current = with_frameworks(torch={**TORCH, **torch_edit}, jax={**JAX, **jax_edit})
    drift = environment_report(recorded, EnvMode.STRICT, current=current).drift
    assert drift, "no drift reported"
    assert str(drift[0]).startswith(text)
    assert all(d.section == "frameworks" for d in drift)


def test_a_setting_the_program_makes_is_named_but_not_drift() -> None:
    # The replaying side is this process, which has only torch's defaults: the replayed
    # program turns deterministic algorithms on again itself.
    recorded = with_frameworks(torch=TORCH)
    current = with_frameworks(torch={**TORCH, "deterministic_algorithms": False, "num_threads": 8})
    report = environment_report(recorded, EnvMode.STRICT, current=current)
    assert report.drift == ()
    assert [str(d) for d in report.notes] == [
        "frameworks torch.deterministic_algorithms True -> False",
        "frameworks torch.num_threads 2 -> 8",
    ]
    assert report.to_json_obj()["notes"][0]["section"] == "frameworks"


def test_a_recorded_framework_missing_here_is_drift() -> None:
    report = environment_report(
        with_frameworks(torch=TORCH, jax=JAX), current=with_frameworks(jax=JAX)
    )
    (d,) = report.drift
    assert str(d) == "frameworks torch 2.13.0+cpu removed"
    # Without a frameworks section at all (a machine without torch or jax) as well.
    (d,) = environment_report(with_frameworks(torch=TORCH), current=LOCK).drift
    assert (d.section, d.name, d.change) == ("frameworks", "torch", "removed")


def test_a_framework_the_recorded_program_did_not_use_is_only_noted() -> None:
    report = environment_report(LOCK, current=with_frameworks(jax=JAX))
    assert report.drift == ()
    assert [str(d) for d in report.notes] == ["frameworks jax 0.10.2 added"]


def test_this_side_is_read_by_importing_the_named_framework() -> None:
    # Recorded: deterministic algorithms on, as the program set them; read here, with a
    # fresh import of torch in a process that never imported it, they are off.
    script = textwrap.dedent(
        """
        import json, sys
        from kronos_audit.replay import environment_report
        from kronos_audit.replay.environment import current_environment

        plain = current_environment()
        assert "frameworks" not in plain
        assert environment_report(plain).differences == ()
        assert "torch" not in sys.modules and "jax" not in sys.modules, "imported for nothing"

        recorded = json.loads(sys.argv[1])
        recorded["frameworks"] = {
            "torch": dict(json.loads(sys.argv[2]), version=None),
            "sklearn": {"version": "1.9.1"},  # not a framework kaudit knows: never imported
        }
        report = environment_report(recorded)
        assert "torch" in sys.modules and "jax" not in sys.modules
        assert "sklearn" not in sys.modules, "imported a name read from the lock"
        print(json.dumps([d.to_json_obj() for d in report.differences]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(LOCK), json.dumps(TORCH)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    found = {
        (d["name"], d["recorded"], d["current"], d["drift"])
        for d in json.loads(done.stdout)
        if d["section"] == "frameworks"
    }
    assert ("torch.version", None, torch.__version__, True) in found
    assert ("torch.deterministic_algorithms", "True", "False", False) in found
    assert ("sklearn", "1.9.1", None, True) in found
