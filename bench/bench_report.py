"""Report benchmark: `kaudit report`.

A run of 1,000 checkpoints (one tiny HDF5 file copied, each signed, a minute apart, one
restart and one day's pause in the timeline) reported in HTML, Markdown and JSON:

- time to build the report (every manifest verified, its data hashed) against the raw
  baseline measured in the same run, `kaudit verify` of the same directory (library call);
  target: the report adds little to the verification it shows (ratio about 1x);
- time to render each format (target: well under a second);
- the size of each file; target: the HTML under 2 MB (aggregated: counts, ranges, the
  failures and the newest checkpoints listed; the chain drawn as one line, not 1,000 rows).

Run: .venv/bin/python bench/bench_report.py [--chain 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import h5py
import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kronos_audit as ka
from bench._common import best_of, scratch_repo
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.keys.home import select_key
from kronos_audit.project.repository import find_project
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.report import ReportFormat, build_report, render
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_checkpoint
from kronos_audit.statement.manifest import Manifest

LIMIT = 2 * 1024 * 1024
START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def long_run(repo: Path, n: int) -> Path:
    """``n`` signed checkpoints, a minute apart, restarted once and paused for a day."""
    directory = repo / "checkpoints" / "long"
    directory.mkdir(parents=True)
    tiny = repo / "tiny.h5"
    with h5py.File(tiny, "w") as f:
        f["x"] = np.arange(16.0)
        f["step"] = np.int64(1)
    project, key, git = find_project(repo), select_key(), git_state(repo)
    digests = digest_file(tiny, md5=True)
    data = tiny.read_bytes()
    parent: Manifest | None = None
    for step in range(1, n + 1):
        path = directory / f"step-{step:08d}.h5"
        path.write_bytes(data)
        when = START + dt.timedelta(minutes=step, days=int(step > 2 * n // 3))
        parent = sign_checkpoint(
            path,
            digests,
            project=project,
            key=key,
            run="long",
            step=step,
            parent=parent,
            git=git,
            record=RunRecord(restart_count=int(step > n // 3)),
            created=when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chain", type=int, default=1000, help="checkpoints in the run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    repo = scratch_repo()
    t0 = time.perf_counter()
    directory = long_run(repo, args.chain)
    print(f"signed {args.chain} checkpoints in {time.perf_counter() - t0:.1f} s (set-up)")

    def verify() -> None:
        results = ka.verify(directory)
        assert len(results) == args.chain
        assert all(r.ok for r in results)

    report = build_report([directory])

    def build() -> None:
        nonlocal report
        report = build_report([directory])
        assert report.ok, report.reasons

    verify()  # warm the page cache and the imports for both
    t_verify = best_of(args.repeat, verify)
    t_build = best_of(args.repeat, build)
    print(
        f"verify {args.chain} manifests: {t_verify:.2f} s; build the report: {t_build:.2f} s, "
        f"ratio {t_build / t_verify:.2f}x (target: about 1x)"
    )
    failed = False
    for fmt in ReportFormat:
        text = ""

        def draw(fmt: ReportFormat = fmt) -> None:
            nonlocal text
            text = render(report, fmt)

        t_render = best_of(args.repeat, draw)
        size = len(text.encode("utf-8"))
        (repo / f"report.{fmt.value}").write_text(text)
        verdict = ""
        if fmt is ReportFormat.HTML:
            failed = size >= LIMIT
            verdict = f" (target: under {LIMIT / 2**20:.0f} MiB: {'FAIL' if failed else 'ok'})"
        print(
            f"{fmt.value:>4}: rendered in {t_render * 1e3:.0f} ms, {size / 1024:.0f} KiB{verdict}; "
            f"total with the build {t_build + t_render:.2f} s"
        )
    print(f"reports written under {repo}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
