"""CLI start-up benchmark (issue 9: a fast CLI).

Measured in one run, each as a fresh process, median of --repeat runs:

- baselines: ``python -c "import click"`` and ``python -c "import h5py"``;
- ``kaudit --help`` (goal: within 1.5x of ``import click``);
- ``kaudit verify`` of a 1 MiB checkpoint (goal: within 1.5x of ``import h5py`` plus the
  time to hash the checkpoint: its sha256, then every dataset's canonical hash);
- ``kaudit status`` of that checkpoint against a DVC remote in a local directory (no
  goal: it shows what asking DVC costs).

Every process may cache bytecode (in a temporary PYTHONPYCACHEPREFIX, whatever
PYTHONDONTWRITEBYTECODE says), as an installed package does: otherwise kaudit's own
modules, and only they, would be compiled from source at each start.

Run: .venv/bin/python bench/bench_cli.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kronos_audit as ka
from bench._common import median_of, scratch_repo
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.project.repository import find_project
from kronos_audit.storage import configure_remote

KAUDIT_SCRIPT = Path(sys.executable).parent / "kaudit"


def kaudit_argv(*args: str) -> list[str]:
    """The installed `kaudit` (its console script) if there is one, as a user runs it."""
    if KAUDIT_SCRIPT.exists():
        return [str(KAUDIT_SCRIPT), *args]
    return [sys.executable, "-c", "from kronos_audit.cli import main; main()", *args]


ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="kaudit-bench-pyc-"),
}


def process(argv: list[str], cwd: Path) -> None:
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True, env=ENV)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="runs of each, median taken")
    args = parser.parse_args()
    n = args.repeat
    repo = scratch_repo()

    ckpt = repo / "checkpoints" / "small" / "step-1.h5"
    ckpt.parent.mkdir(parents=True)
    with h5py.File(ckpt, "w") as f:  # 1 MiB of float64 state in two datasets
        rng = np.random.default_rng(0)
        f["fields/u"] = rng.standard_normal(2**16)
        f["fields/v"] = rng.standard_normal(2**16)
    (manifest,) = ka.snapshot(ckpt, run="small", step=1)
    remote = repo.parent / "remote"
    remote.mkdir()
    configure_remote(find_project(repo), str(remote), "storage")
    size = ckpt.stat().st_size

    def click_import() -> None:
        process([sys.executable, "-c", "import click"], repo)

    def h5py_import() -> None:
        process([sys.executable, "-c", "import h5py"], repo)

    def help_() -> None:
        process(kaudit_argv("--help"), repo)

    def verify() -> None:
        process(kaudit_argv("verify", str(manifest.path)), repo)

    def status() -> None:
        process(kaudit_argv("status", str(manifest.path)), repo)

    def hashing() -> None:
        digest_file(ckpt)  # the file's sha256 and every dataset's hash, as verify makes them

    for warm in (click_import, h5py_import, help_, verify, status, hashing):
        warm()  # page cache, .pyc files
    t_click = median_of(n, click_import)
    t_h5py = median_of(n, h5py_import)
    t_hash = median_of(n, hashing)
    t_help = median_of(n, help_)
    t_verify = median_of(n, verify)
    t_status = median_of(n, status)

    def ms(t: float) -> str:
        return f"{t * 1e3:7.1f} ms"

    def verdict(ratio: float, goal: float) -> str:
        return f"ratio {ratio:.2f}x (goal <= {goal}x: {'met' if ratio <= goal else 'NOT met'})"

    print(f"median of {n} runs each; checkpoint {size / 2**20:.2f} MiB; kaudit = {kaudit_argv()}")
    print(f"  python -c 'import click'     {ms(t_click)}  baseline")
    print(f"  python -c 'import h5py'      {ms(t_h5py)}  baseline")
    print(f"  hashing the checkpoint       {ms(t_hash)}  in process (sha256 + datasets)")
    print(f"  kaudit --help                {ms(t_help)}  {verdict(t_help / t_click, 1.5)}")
    print(
        f"  kaudit verify (1 MiB)        {ms(t_verify)}  "
        f"{verdict(t_verify / (t_h5py + t_hash), 1.5)} against import h5py + hashing"
    )
    print(
        f"  kaudit status (DVC remote)   {ms(t_status)}  "
        f"ratio {t_status / t_h5py:.2f}x import h5py (no goal)"
    )
    os.unlink(ckpt)


if __name__ == "__main__":
    main()
