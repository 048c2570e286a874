"""CLI start-up benchmark: what a user waits for before kaudit does anything.

Measured in one run, each as a fresh process, median of --repeat runs:

- baselines: ``python -c "import click"`` and ``python -c "import h5py"``;
- ``kaudit --help`` (goal: within 1.5x of ``import click``);
- ``kaudit verify --help`` (no goal: a command's help imports its module, not the library);
- ``kaudit verify`` of a small signed run, three chained 1/3 MiB checkpoints, against
  ``import h5py`` plus the time to hash them (each file's sha256, then every dataset's
  canonical hash); no goal: the old one of 1.5x is retired, jsonschema being the validator
  the project is built on;
- ``kaudit status`` of that run against a DVC remote in a local directory (no goal: it
  shows what asking DVC costs).

Every process may cache bytecode (in a temporary PYTHONPYCACHEPREFIX, whatever
PYTHONDONTWRITEBYTECODE says), as an installed package does: otherwise kaudit's own
modules, and only they, would be compiled from source at each start.

Run: .venv/bin/python bench/bench_cli.py [--repeat 9]
     .venv/bin/python bench/bench_cli.py --quick   (a smoke run: one run of each, no warm-up,
     in the environment as it is, with whatever bytecode is already there)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
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
STEPS = 3
HELP_GOAL = 1.5


def kaudit_argv(*args: str) -> list[str]:
    """The installed `kaudit` (its console script) if there is one, as a user runs it."""
    if KAUDIT_SCRIPT.exists():
        return [str(KAUDIT_SCRIPT), *args]
    return [sys.executable, "-c", "from kronos_audit.cli import main; main()", *args]


def signed_run(repo: Path) -> list[Path]:
    """A run of STEPS chained checkpoints, 1 MiB of float64 state in all, each signed."""
    run_dir = repo / "checkpoints" / "small"
    run_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    parent = None
    checkpoints = []
    for step in range(1, STEPS + 1):
        ckpt = run_dir / f"step-{step}.h5"
        with h5py.File(ckpt, "w") as f:
            f["fields/u"] = rng.standard_normal(2**16 // STEPS)
            f["fields/v"] = rng.standard_normal(2**16 // STEPS)
        (manifest,) = ka.snapshot(ckpt, run="small", step=step, parent=parent)
        parent = manifest.path
        checkpoints.append(ckpt)
    return checkpoints


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure and print; the medians in seconds, by name."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="runs of each, median taken")
    parser.add_argument(
        "--quick", action="store_true", help="one run of each, no warm-up (a smoke run)"
    )
    args = parser.parse_args(argv)
    n = 1 if args.quick else args.repeat
    repo = scratch_repo()
    pycache = tempfile.mkdtemp(prefix="kaudit-bench-pyc-")
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "PYTHONPYCACHEPREFIX": pycache,
    }
    if args.quick:
        # A smoke run (--quick) only shows that every part runs, each once: in the
        # environment as it is, with the bytecode already there, none compiled for it.
        env = dict(os.environ)
    try:
        checkpoints = signed_run(repo)
        run_dir = checkpoints[0].parent
        remote = repo.parent / "remote"
        remote.mkdir()
        configure_remote(find_project(repo), str(remote), "storage")
        size = sum(c.stat().st_size for c in checkpoints)

        def process(argv: list[str]) -> None:
            subprocess.run(argv, cwd=repo, check=True, capture_output=True, env=env)

        def hashing() -> None:
            for ckpt in checkpoints:  # each file's sha256 and datasets, as verify makes them
                digest_file(ckpt)

        measured: dict[str, Callable[[], None]] = {
            "import click": lambda: process([sys.executable, "-c", "import click"]),
            "import h5py": lambda: process([sys.executable, "-c", "import h5py"]),
            "hashing": hashing,
            "kaudit --help": lambda: process(kaudit_argv("--help")),
            "kaudit verify --help": lambda: process(kaudit_argv("verify", "--help")),
            "kaudit verify": lambda: process(kaudit_argv("verify", str(run_dir))),
            "kaudit status": lambda: process(kaudit_argv("status", str(run_dir))),
        }
        if not args.quick:  # a smoke run's times are no measure to judge: not warmed
            for warm in measured.values():
                warm()  # page cache, .pyc files
        t = {name: median_of(n, fn) for name, fn in measured.items()}
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
        shutil.rmtree(pycache, ignore_errors=True)

    def ms(x: float) -> str:
        return f"{x * 1e3:7.1f} ms"

    def verdict(ratio: float, goal: float) -> str:
        return f"ratio {ratio:.2f}x (goal <= {goal}x: {'met' if ratio <= goal else 'NOT met'})"

    click, h5 = t["import click"], t["import h5py"]
    print(
        f"median of {n} run(s) each; {STEPS} checkpoints, {size / 2**20:.2f} MiB; "
        f"kaudit = {kaudit_argv()}"
    )
    print(f"  python -c 'import click'     {ms(click)}  baseline")
    print(f"  python -c 'import h5py'      {ms(h5)}  baseline")
    print(f"  hashing the run              {ms(t['hashing'])}  in process (sha256 + datasets)")
    print(
        f"  kaudit --help                {ms(t['kaudit --help'])}  "
        f"{verdict(t['kaudit --help'] / click, HELP_GOAL)} against import click"
    )
    print(
        f"  kaudit verify --help         {ms(t['kaudit verify --help'])}  "
        f"ratio {t['kaudit verify --help'] / click:.2f}x import click (no goal)"
    )
    print(
        f"  kaudit verify (the run)      {ms(t['kaudit verify'])}  "
        f"ratio {t['kaudit verify'] / (h5 + t['hashing']):.2f}x import h5py + hashing (no goal)"
    )
    print(
        f"  kaudit status (DVC remote)   {ms(t['kaudit status'])}  "
        f"ratio {t['kaudit status'] / h5:.2f}x import h5py (no goal)"
    )
    return t


if __name__ == "__main__":
    main()
