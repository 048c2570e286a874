"""Gate benchmark: `kaudit gate`.

A run of --checkpoints checkpoints of the heat example is recorded and committed; then
`kaudit gate` (the whole CLI, a fresh process) verifies every manifest and replays
--segments sampled segments ([gate] segments = 5). Printed against the sum of its parts
measured in the same run:

- one `kaudit verify` of every manifest of the run (the whole CLI, a fresh process);
- the sampled segments' own compute: each segment's command as the replay ran it (the
  program's own process, resuming from its parent: `timings.command` of a replay).

Goal: gate <= 1.2 x (verify + segments' compute) + 2 s.

Run: .venv/bin/python bench/bench_gate.py [--checkpoints 1000] [--segments 5] [--n 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import heat_repo

CLI = [sys.executable, "-c", "from kronos_audit.cli import main; main()"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def kaudit(repo: Path, *args: str) -> tuple[float, dict[str, Any]]:
    """The whole CLI in a fresh process, with --json: its wall time and its result."""
    t0 = time.perf_counter()
    done = subprocess.run([*CLI, *args, "--json"], cwd=repo, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"kaudit {args[0]} failed ({done.returncode}): {done.stdout[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return wall, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--segments", type=int, default=5)
    parser.add_argument("--n", type=int, default=64, help="grid points per side")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    repo = heat_repo()
    config = repo / ".kaudit" / "config.toml"
    config.write_text(config.read_text() + f"\n[gate]\nsegments = {args.segments}\nseed = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "heat")
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "run.py",
            "--steps",
            str(args.checkpoints),
            "--every",
            "1",
            "--n",
            str(args.n),
        ],
        cwd=repo / "heat",
        check=True,
        capture_output=True,
    )
    recorded = time.perf_counter() - t0
    run_dir = repo / "heat" / "checkpoints" / "heat"
    n = sum(1 for _ in run_dir.glob("*.kaudit.json"))
    print(f"recorded a run of {n} checkpoints ({args.n}x{args.n} heat) in {recorded:.1f} s")

    gates: list[float] = []
    verifies: list[float] = []
    doc: dict[str, Any] = {}
    for _ in range(args.repeat):  # interleaved: the machine may be shared
        wall, doc = kaudit(repo, "gate")
        gates.append(wall)
        wall, _ = kaudit(repo, "verify", str(run_dir.relative_to(repo)))
        verifies.append(wall)
    assert doc["ok"], doc["failures"]
    replayed = [c for c in doc["cases"] if c["kind"] == "replay"]
    assert len(replayed) == args.segments, replayed
    verified = sum(1 for c in doc["cases"] if c["kind"] == "verify")

    # The segments' own compute: each sampled segment's command, as a replay runs it.
    from kronos_audit.replay import replay

    computes = []
    history = []  # what each replay spends verifying its chain again
    for case in replayed:
        result = replay(repo / case["name"])
        computes.append(result.timings.command)
        history.append(result.timings.verify)
    t_gate, t_verify, t_compute = min(gates), min(verifies), sum(computes)
    budget = 1.2 * (t_verify + t_compute) + 2.0
    print(f"kaudit gate: {verified} manifests verified, {len(replayed)} segments replayed")
    print(f"  kaudit verify of every manifest (whole CLI)     {t_verify:7.2f} s")
    print(
        f"  the {len(replayed)} segments' own compute (their commands) {t_compute:7.2f} s  "
        f"(steps {', '.join(str(c['step']) for c in replayed)})"
    )
    print(f"  sum                                             {t_verify + t_compute:7.2f} s")
    print(
        f"  kaudit gate (whole CLI, best of {args.repeat})               {t_gate:7.2f} s  "
        f"ratio {t_gate / (t_verify + t_compute):.2f}x the sum "
        f"= {t_gate - t_verify - t_compute:+.2f} s"
    )
    print(
        f"  (a replay alone verifies its chain back to the first checkpoint: "
        f"{sum(history):.2f} s for these {len(history)}; the gate lends them what it verified)"
    )
    verdict = "met" if t_gate <= budget else "NOT met"
    print(f"goal: gate <= 1.2 x sum + 2 s = {budget:.2f} s: {verdict}")


if __name__ == "__main__":
    main()
