"""The CPU's floating-point dispatch: what the lock records of it, the portable pins, what
a replay gives its command, the one-line cause of a NOT REPRODUCED verdict, and a Run that
asks for the portable dispatch after a library had chosen its kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.provenance import dispatch
from kronos_audit.provenance.dispatch import (
    DISPATCH_ENV,
    DISPATCH_VARIABLES,
    apply_pins,
    isa_level,
    replay_pins,
)
from kronos_audit.provenance.environment import environment_lock
from kronos_audit.replay.environment import environment_report, kernels

V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
V3 = V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def test_the_isa_level_is_the_highest_whose_every_flag_is_there() -> None:
    assert isa_level(frozenset(), "x86_64") == "x86-64-v1"
    assert isa_level(V3 - {"fma"}, "x86_64") == "x86-64-v2"
    assert isa_level(V3, "x86_64") == "x86-64-v3"
    assert isa_level(V4, "x86_64") == "x86-64-v4"
    assert isa_level(V4 - {"avx2"}, "x86_64") == "x86-64-v2"  # levels nest
    assert isa_level(frozenset({"asimd", "sve"}), "aarch64") == "aarch64"


def test_the_lock_records_the_cpu_and_what_kernels_are_chosen_by() -> None:
    lock = environment_lock(["torch"])
    cpu = lock["cpu"]
    assert {"model", "count", "vendor", "isa", "features", "dispatch"} <= set(cpu)
    assert cpu["dispatch"] == (
        "portable" if os.environ.get(DISPATCH_ENV) == "portable" else "native"
    )
    assert set(cpu["features"].split()) <= dispatch.RECORDED_FEATURES
    assert cpu["numpy_simd"]  # numpy is imported by the lock itself
    torch = pytest.importorskip("torch")
    assert lock["frameworks"]["torch"]["cpu_capability"] == str(
        torch.backends.cpu.get_cpu_capability()
    )


def test_the_portable_pins_are_every_dispatch_variable_a_machine_has() -> None:
    try:
        pins = dispatch.portable_variables(threads=3)
    except dispatch.DispatchError as e:
        pytest.skip(f"needs an x86-64-v3 CPU or an aarch64 one: {e}")
    assert pins[DISPATCH_ENV] == "portable"
    assert {pins[n] for n in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")} == {
        "3"
    }
    assert set(pins) <= set(DISPATCH_VARIABLES)
    if os.uname().machine == "x86_64":
        assert pins["ATEN_CPU_CAPABILITY"] == "avx2"
        assert pins["MKL_CBWR"] == "COMPATIBLE"  # the one branch MKL keeps alike on any vendor
        assert pins["OPENBLAS_CORETYPE"] == "Haswell"
        assert all(
            t.startswith(("AVX512", "X86_V4", "AMX"))
            for t in pins["NPY_DISABLE_CPU_FEATURES"].split()
        )


def test_a_replay_gives_a_portable_run_its_recorded_pins_and_a_native_run_nothing() -> None:
    assert replay_pins({"OMP_NUM_THREADS": "4"}) == {}
    recorded = {DISPATCH_ENV: "portable", "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"}
    pins = replay_pins(recorded)
    assert set(pins) == set(DISPATCH_VARIABLES)
    assert pins["ATEN_CPU_CAPABILITY"] == "avx2"
    assert pins["MKL_CBWR"] is None  # not recorded: removed from the command's environment
    mine = {"MKL_CBWR": "AVX512", "ATEN_CPU_CAPABILITY": "default", "HOME": "/root"}
    assert apply_pins(mine, pins) == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "HOME": "/root",
        DISPATCH_ENV: "portable",
        "OMP_NUM_THREADS": "2",
    }


@pytest.mark.parametrize(
    "value",
    ["--xla_dump_to=/tmp/x", "avx2; rm -rf ~", "$(id)", "a\nb", "x" * 600, ""],
)
def test_a_recorded_pin_must_be_a_plain_setting(value: str) -> None:
    with pytest.raises(ValueError, match="ATEN_CPU_CAPABILITY is not a plain setting"):
        replay_pins({DISPATCH_ENV: "portable", "ATEN_CPU_CAPABILITY": value})


def _lock(
    cpu: dict[str, object], torch: dict[str, object] | None = None, **variables: str
) -> dict[str, object]:
    lock: dict[str, object] = {
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "platform": {"system": "Linux", "machine": "x86_64"},
        "cpu": cpu,
        "blas": {"name": "openblas", "version": "0.3"},
        "variables": variables,
        "packages": {"numpy": "2.4.6"},
        "digest": "0" * 64,
    }
    if torch is not None:
        lock["frameworks"] = {"torch": {"version": "2.13.0", **torch}}
    return lock


XEON = {"model": "Intel(R) Xeon(R)", "count": 2, "vendor": "GenuineIntel", "isa": "x86-64-v4"}
EPYC = {"model": "AMD EPYC", "count": 2, "vendor": "AuthenticAMD", "isa": "x86-64-v4"}


def test_the_cause_names_the_dispatch_that_changed_and_the_ways_out() -> None:
    report = environment_report(
        _lock(XEON, {"cpu_capability": "AVX512"}),
        current=_lock(EPYC, {"cpu_capability": "AVX512"}),
        program=True,
    )
    assert report.kernels == ("AVX512 on Intel(R) Xeon(R)", "AVX512 on AMD EPYC")
    assert report.cause() == (
        "the CPU dispatch changed (AVX512 on Intel(R) Xeon(R) -> AVX512 on AMD EPYC): replay "
        "on a matching CPU, record with a portable dispatch (kaudit run --portable), or "
        "compare with a tolerance"
    )
    threads = environment_report(
        _lock(XEON, OMP_NUM_THREADS="4"), current=_lock(XEON, OMP_NUM_THREADS="1")
    )
    assert threads.cause() == (
        "the thread counts changed (OMP_NUM_THREADS 4 -> 1): replay with the recorded thread "
        "counts, or compare with a tolerance"
    )
    same = _lock(XEON, {"cpu_capability": "AVX512"})
    assert environment_report(same, current=same).cause() is None


def test_a_portable_run_notes_the_cpu_model_and_judges_what_was_chosen() -> None:
    portable = {"dispatch": "portable", "numpy_simd": "X86_V3"}
    report = environment_report(
        _lock({**XEON, **portable}, {"cpu_capability": "AVX2"}),
        current=_lock({**EPYC, **portable}, {"cpu_capability": "AVX2"}),
        program=True,
    )
    assert report.drift == ()
    assert {d.name for d in report.notes} == {"model", "vendor"}
    assert kernels(_lock({**EPYC, **portable}, {"cpu_capability": "AVX2"})) == (
        "AVX2 on AMD EPYC (portable)"
    )
    # what the pins did not hold is drift still: numpy's loops chosen otherwise
    drifted = environment_report(
        _lock({**XEON, **portable}),
        current=_lock({**EPYC, "dispatch": "portable", "numpy_simd": "X86_V3 X86_V4"}),
        program=True,
    )
    assert [str(d) for d in drifted.drift] == ["cpu numpy_simd X86_V3 -> X86_V3 X86_V4"]


def test_fields_a_lock_did_not_record_then_are_noted() -> None:
    old = _lock({"model": "Intel(R) Xeon(R)", "count": 2}, {})
    new = _lock(XEON, {"cpu_capability": "AVX512"})
    report = environment_report(old, current=new, program=True)
    assert report.drift == ()
    assert {(d.section, d.name) for d in report.notes} == {
        ("cpu", "vendor"),
        ("cpu", "isa"),
        ("frameworks", "torch.cpu_capability"),
    }


def test_run_refuses_a_dispatch_it_does_not_know() -> None:
    import kronos_audit as ka

    with pytest.raises(UsageError, match="dispatch must be 'native' or 'portable'"):
        ka.Run("r", dispatch="fast")


PINNED_LATE = """
import warnings
import torch
torch.backends.cpu.get_cpu_capability()  # torch has chosen its kernels: DEFAULT
import kronos_audit as ka
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ka.Run("late", root=".", dispatch="portable")
import os
print(os.environ["KAUDIT_DISPATCH"], os.environ["ATEN_CPU_CAPABILITY"])
for w in caught:
    print(type(w.message).__name__, w.message)
"""


def test_a_run_that_asks_for_the_portable_dispatch_too_late_is_told_what_had_chosen(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    try:
        dispatch.portable_variables()
    except dispatch.DispatchError as e:
        pytest.skip(str(e))
    env = {k: v for k, v in os.environ.items() if k not in DISPATCH_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", PINNED_LATE],
        cwd=tmp_path,
        env={**env, "ATEN_CPU_CAPABILITY": "default"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "portable avx2"  # its children get the pins
    assert any(
        line.startswith("DispatchNotPinned the portable dispatch was asked for after ")
        and "torch's DEFAULT kernels" in line
        and "kaudit run --portable" in line
        for line in lines[1:]
    ), lines
