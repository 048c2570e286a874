"""kaudit's verdicts agree with HDF5's own h5diff on the same files.

``h5diff -d EPS A B`` reports an element when ``|a - b| > EPS``: kaudit's ``atol=EPS``.
``h5diff -p REL A B`` reports an element when ``|(b - a) / a| > REL`` where ``a`` is the
value in the FIRST file (tools/lib/h5diff_array.c: ``PER(A,B)`` divides by ``A``, "the
true value ... value in first dataset"), although ``h5diff --help`` prints
``|(a-b)/b|``. So ``h5diff -p REL A B`` is kaudit's ``rtol=REL`` with A as reference,
files in the same order; ``test_relative_divides_by_the_first_file`` pins this down.

Agreement is checked per file (exit status) and per dataset (the number of differing
elements). Known, deliberate divergences, each pinned by a test below: h5diff -p never
reports an infinity in the first file (its relative error is NaN), and h5diff exits 0
when the only problem is a dataset it cannot compare (shape or type differs): it prints
"Some objects are not comparable" and passes. kaudit's NOT_COMPARABLE always fails.

h5diff comes from Debian's hdf5-tools; scripts/ensure-tools.sh installs it when missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from kronos_audit.compare import Comparison, TolerancePolicy, Verdict, compare_files

ROOT = Path(__file__).resolve().parents[2]
EPSILONS = [1e-13, 1e-9, 1e-5, 1e-2, 0.5]
FOUND = re.compile(r"^(\d+) differences? found$", re.MULTILINE)


@pytest.fixture(scope="module")
def h5diff() -> str:
    path = shutil.which("h5diff")
    if path is None:
        script = ROOT / "scripts" / "ensure-tools.sh"
        proc = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=900, check=False
        )
        path = shutil.which("h5diff")
        if path is None:
            why = proc.stderr.strip() or f"exit status {proc.returncode}"
            pytest.skip(f"h5diff is not installed and scripts/ensure-tools.sh failed: {why}")
    return path


def write(path: Path, datasets: dict[str, np.ndarray]) -> Path:
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            if data.ndim >= 2:  # vary the layout too: it must not matter
                f.create_dataset(name, data=data, chunks=True, compression="gzip")
            else:
                f[name] = data
    return path


def _pairs() -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    rng = np.random.default_rng(2024)
    base = rng.standard_normal((40, 25)) * 10.0 ** rng.integers(-3, 4, (40, 25))
    small = rng.standard_normal(300).astype(np.float32)
    vec = rng.standard_normal(500)

    def tweak(x: np.ndarray, count: int, rel: float) -> np.ndarray:
        y = x.copy()
        flat = y.reshape(-1)
        idx = rng.choice(flat.size, count, replace=False)
        flat[idx] = flat[idx] * (1 + rel * rng.choice([-1.0, 1.0], count))
        return y

    spread = base.copy().reshape(-1)
    for i, rel in enumerate([1e-15, 1e-11, 1e-7, 1e-4, 3e-3, 0.2, 2.0]):
        spread[i * 37 : i * 37 + 20] *= 1 + rel
    with_zeros_a = vec.copy()
    with_zeros_a[:10] = 0.0
    with_zeros_b = with_zeros_a.copy()
    with_zeros_b[:5] = 1e-6  # A is 0: no relative tolerance accepts these
    nan_a = vec.copy()
    nan_a[[3, 50, 400]] = np.nan
    nan_same = nan_a.copy()
    nan_same[7] += 1e-6
    nan_moved = nan_a.copy()
    nan_moved[50] = 1.0
    nan_moved[51] = np.nan
    inf_a = vec.copy()
    inf_a[[1, 2, 3]] = [np.inf, -np.inf, np.inf]
    inf_b = inf_a.copy()
    inf_b[3] = -np.inf
    inf_b[4] = np.inf
    return {
        "equal": (
            {"f": base, "v": vec, "s": small},
            {"f": base.copy(), "v": vec.copy(), "s": small.copy()},
        ),
        "tiny perturbation": (
            {"f": base, "v": vec, "s": small},
            {"f": tweak(base, 30, 1e-14), "v": tweak(vec, 5, 1e-12), "s": small},
        ),
        "spread of errors": (
            {"f": base, "s": small, "z": with_zeros_a},
            {"f": spread.reshape(base.shape), "s": tweak(small, 40, 1e-3), "z": with_zeros_b},
        ),
        "NaN at the same places": ({"n": nan_a}, {"n": nan_same}),
        "NaN moved": ({"n": nan_a, "v": vec}, {"n": nan_moved, "v": vec}),
        "infinities": ({"i": inf_a}, {"i": inf_b}),
        "signed zeros": (
            {"z": np.array([0.0, -0.0, 1.0]), "v": vec},
            {"z": np.array([-0.0, 0.0, 1.0]), "v": vec},
        ),
        "different shape": ({"f": base, "v": vec}, {"f": base[:39], "v": vec}),
        "only in A": ({"f": base, "v": vec}, {"f": base}),
        "only in B": ({"v": vec}, {"v": vec, "extra": vec}),
    }


PAIRS = _pairs()


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    out = {}
    for i, (name, (a, b)) in enumerate(PAIRS.items()):
        d = tmp_path_factory.mktemp(f"pair{i}")
        out[name] = (write(d / "a.h5", a), write(d / "b.h5", b))
    return out


def run_h5diff(h5diff: str, *args: str) -> tuple[int, str]:
    proc = subprocess.run([h5diff, *args], capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, proc.stdout


def count(h5diff: str, flag: list[str], a: Path, b: Path, name: str) -> int:
    status, out = run_h5diff(h5diff, *flag, str(a), str(b), name, name)
    found = FOUND.findall(out)
    assert len(found) <= 1, out
    n = int(found[0]) if found else 0
    assert (status == 1) == (n > 0), out
    return n


def h5diff_status(ours: Comparison) -> int:
    """The exit status h5diff gives where kaudit's verdicts are ``ours``: 1 when a dataset
    differs or is in one file only; NOT_COMPARABLE alone, h5diff lets pass with 0."""
    seen = (Verdict.DIFFERENT, Verdict.ONLY_IN_A, Verdict.ONLY_IN_B)
    return 1 if any(d.verdict in seen for d in ours.datasets) else 0


MODES: dict[str, Callable[[float], tuple[list[str], TolerancePolicy]]] = {
    "-d (absolute)": lambda eps: (["-d", repr(eps)], TolerancePolicy.from_options(atol=eps)),
    "-p (relative)": lambda eps: (["-p", repr(eps)], TolerancePolicy.from_options(rtol=eps)),
}


CASES = [
    (pair, eps, mode)
    for pair in PAIRS
    for eps in EPSILONS
    for mode in MODES
    # h5diff -p cannot see infinities: test_h5diff_relative_misses_infinities
    if not (pair == "infinities" and mode.startswith("-p"))
]


@pytest.mark.parametrize(("pair", "eps", "mode"), CASES)
def test_verdicts_agree_with_h5diff(
    h5diff: str,
    pair_files: dict[str, tuple[Path, Path]],
    pair: str,
    eps: float,
    mode: str,
) -> None:
    a, b = pair_files[pair]
    flag, policy = MODES[mode](eps)
    ours = compare_files(a, b, policy)
    status, out = run_h5diff(h5diff, *flag, str(a), str(b))
    assert status == h5diff_status(ours), f"{pair}, {mode} {eps}:\n{out}"
    if ours.counts()[Verdict.NOT_COMPARABLE]:
        assert "Some objects are not comparable" in out
        assert not ours.ok
    for d in ours.datasets:
        if d.verdict in (Verdict.ONLY_IN_A, Verdict.ONLY_IN_B, Verdict.NOT_COMPARABLE):
            continue
        theirs = count(h5diff, flag, a, b, d.path)
        assert d.mismatches == theirs, f"{pair} {d.path}, {mode} {eps}"


@pytest.mark.parametrize("pair", list(PAIRS))
def test_exact_comparison_agrees_with_plain_h5diff(
    h5diff: str, pair_files: dict[str, tuple[Path, Path]], pair: str
) -> None:
    a, b = pair_files[pair]
    ours = compare_files(a, b)
    status, out = run_h5diff(h5diff, str(a), str(b))
    assert status == h5diff_status(ours), out
    for d in ours.datasets:
        if d.verdict in (Verdict.IDENTICAL, Verdict.DIFFERENT):
            assert d.mismatches == count(h5diff, [], a, b, d.path), d.path


def test_relative_divides_by_the_first_file(h5diff: str, tmp_path: Path) -> None:
    one = write(tmp_path / "one.h5", {"x": np.array([1.0])})
    two = write(tmp_path / "two.h5", {"x": np.array([2.0])})
    # |1 - 2| / |1| = 1 > 0.6 but |2 - 1| / |2| = 0.5 <= 0.6: only the first file divides
    assert run_h5diff(h5diff, "-p", "0.6", str(one), str(two))[0] == 1
    assert run_h5diff(h5diff, "-p", "0.6", str(two), str(one))[0] == 0
    rtol = TolerancePolicy.from_options(rtol=0.6)
    assert not compare_files(one, two, rtol).ok
    assert compare_files(two, one, rtol).ok


def test_h5diff_relative_misses_infinities(h5diff: str, tmp_path: Path) -> None:
    """h5diff -p computes |(b - inf) / inf| = NaN, and NaN > REL is false: it passes an
    infinity against any number. kaudit fails it whatever the tolerance."""
    a = write(tmp_path / "a.h5", {"x": np.array([np.inf, -np.inf])})
    b = write(tmp_path / "b.h5", {"x": np.array([1.0, np.inf])})
    assert run_h5diff(h5diff, "-p", "0.1", str(a), str(b))[0] == 0
    r = compare_files(a, b, TolerancePolicy.from_options(rtol=0.1)).get("x")
    assert r.verdict is Verdict.DIFFERENT
    assert r.inf_mismatches == 2


@pytest.mark.parametrize("other", [np.zeros(5), np.zeros(4, dtype=np.int32)])
def test_h5diff_passes_what_it_cannot_compare(
    h5diff: str, tmp_path: Path, other: np.ndarray
) -> None:
    """h5diff prints "Some objects are not comparable" and exits 0 when a dataset's shape
    or type differs and nothing else does. kaudit's NOT_COMPARABLE always fails."""
    a = write(tmp_path / "a.h5", {"x": np.zeros(4), "y": np.ones(3)})
    b = write(tmp_path / "b.h5", {"x": other, "y": np.ones(3)})
    status, out = run_h5diff(h5diff, str(a), str(b))
    assert status == 0
    assert "not comparable" in out
    result = compare_files(a, b)
    assert result.get("x").verdict is Verdict.NOT_COMPARABLE
    assert not result.ok


def test_ensure_tools_is_quiet_and_idempotent(h5diff: str) -> None:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-tools.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""
