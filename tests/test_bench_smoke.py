"""The benchmarks run end to end (their --quick modes), so they cannot rot unseen."""

from __future__ import annotations

import pytest

from bench import bench_frameworks

pytestmark = pytest.mark.slow  # four fresh processes, importing torch and jax


def test_the_framework_benchmark_runs_every_contender_and_judges_every_goal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The contenders' torch loops update 8 MiB in place on torch's OpenMP threads, which
    # spin between updates; beside the suite's other workers on a machine's few cores that
    # spinning tripled the run's CPU time. Waiting passively changes no thread count.
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    goals = bench_frameworks.main(["--quick"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    for name in ("kaudit", "dcp", "orbax"):
        stalls, costs = (
            [r for r in rows if r[:1] == [name] and r[1].isdigit()],
            [r for r in rows if r[:1] == [name] and r[1].endswith("%")],
        )
        (stall,) = stalls
        assert int(stall[1]) >= 1, stall  # each took checkpoints
        # what the job paid beside the stalls: wall time and CPU over the loop without writes
        (paid,) = costs
        assert paid[2].startswith(("+", "-")), paid
        assert float(paid[3]) == float(paid[3]), paid  # a number, not nan
    assert "baseline: one np.copyto" in out
    assert goals is not None
    assert len(goals) == 6
    assert out.count("PASS") + out.count("MISS") == 6  # timings vary: judged, not asserted


def test_the_shard_scale_model_runs_and_one_rank_pays_what_it_did(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_shards

    rows = bench_shards.main(["--quick"])
    out = capsys.readouterr().out
    assert [r["ranks"] for r in rows] == [100, 1_000]
    small, large = rows
    # Sizes are exact, not timings: the manifest does not grow with the ranks, the index
    # is one fixed-width line per rank.
    assert abs(large["manifest_bytes"] - small["manifest_bytes"]) <= 16
    assert large["index_bytes"] == 10 * small["index_bytes"]
    assert "baseline: sha256 of the rank's own shard" in out
    assert "one rank's restore verification at 1,000 ranks costs" in out


def test_the_rank_benchmark_launches_one_and_two_ranks_and_reports_against_the_raw_write(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_ranks

    rows = bench_ranks.main(["--quick"])
    out = capsys.readouterr().out
    assert rows is not None
    # Each launch asserts on rank 0 that every step it timed was signed (one manifest per
    # checkpoint), so a row here means real checkpoints under a real mpiexec were measured.
    assert [r["ranks"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("raw_share", "sync", "async", "stall", "copyto", "x_md5"):
            assert row[key] > 0, row  # timings vary: measured and printed, not judged
    assert "baseline: one process writing+fsyncing the 2 MiB to one file" in out
    assert "the sync durable commit against one md5 pass over the same 2 MiB" in out
    # the node-local launch (ranks in clones of their own, meeting in the remote) on 2 ranks
    assert "node_local" not in rows[0]
    assert rows[1]["node_local"] > 0, rows[1]
    assert "x pushed" in out
    # weak scaling against the peer (2 processes doing the same job without kaudit, in the
    # same launch), on the disk and on tmpfs where there is one: judged, not asserted. Judged
    # only where the 2 ranks have a core each: on one core they share it, and the verdict
    # says so (NOT JUDGED) whatever the figure.
    assert "weak scaling against the peer" in out
    assert rows[1]["weak_disk"] > 0, rows[1]
    verdicts = ("PASS", "MISS") if bench_ranks.usable_cores() >= 2 else ("NOT JUDGED",)
    judged = sum(out.count(f"{verdict}  weak scaling") for verdict in verdicts)
    assert judged == 1 + ("weak_tmpfs" in rows[1]), out
    assert [line.split()[0] for line in out.splitlines() if line[:5].strip().isdigit()] == [
        "1",
        "2",
    ]


def test_the_cli_benchmark_times_every_start_up_against_its_baselines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_cli

    times = bench_cli.main(["--quick"])
    out = capsys.readouterr().out
    assert set(times) == {
        "import click",
        "import h5py",
        "hashing",
        "kaudit --help",
        "kaudit verify --help",
        "kaudit verify",
        "kaudit status",
    }
    assert all(t > 0 for t in times.values()), times
    assert "python -c 'import click'" in out
    assert "baseline" in out
    # timings vary: each goal judged and printed, not asserted
    assert out.count("goal <= ") == 1  # --help; verify's goal is retired
    assert out.count("met)") == 1


def test_the_campaign_benchmark_runs_map_batches_beside_the_bare_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_campaign

    result = bench_campaign.main(["--quick"])
    out = capsys.readouterr().out
    assert "baseline: bare engine map + gather" in out
    assert result["ratio"] > 0  # timings vary: measured and printed, not judged
    assert [r["batches"] for r in result["ledger"]] == [100, 2_000]
    small, large = result["ledger"]
    assert large["bytes"] == small["bytes"]  # a chunk holds the new batches only
    array = result["array"]
    assert array["serial"]  # the job array's certified tally is a serial run's
    assert "--array=0,3,5 " in array["resubmit"]  # the dropped tasks, and only they


def test_the_dcp_benchmark_saves_plain_and_signed_on_two_ranks_and_judges_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_dcp

    result = bench_dcp.main(["--quick"])
    out = capsys.readouterr().out
    for mode in ("plain", "signed", "files"):
        assert result[mode]["wall"] > 0
    assert set(result["ratios"]) == {"signed wall", "signed cpu", "files wall", "files cpu"}
    assert out.count("PASS") + out.count("MISS") == 4  # timings vary: judged, not asserted
    assert "baseline: hashing one rank's" in out


def test_the_long_run_benchmark_prints_every_figure_beside_its_baseline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_long_run

    figures = bench_long_run.main(["--quick"])
    out = capsys.readouterr().out
    for key in ("commit_10", "commit_n", "restore_10", "restore_n", "restore_n_full"):
        assert figures[key] > 0, figures
    for key in ("verify_mid", "verify_n", "status_n", "log_n", "ranks_early", "ranks_n"):
        assert figures[key] > 0, figures
    # timings vary: each ratio printed and judged, never asserted
    for line in (
        "per-checkpoint cost at 20",
        "restore after 20 (this process)",
        "kaudit verify of 14 checkpoints",
        "multi-rank commit at step 8",
    ):
        (row,) = [r for r in out.splitlines() if line in r]
        assert "PASS" in row or "MISS" in row, row
    assert "restore after 20, no chain memo" in out
    assert "kaudit status of 20 checkpoints" in out
    assert "kaudit log of 20 checkpoints" in out


def test_the_many_tensors_benchmark_runs_every_contender_and_judges_every_goal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_many_tensors

    ratios = bench_many_tensors.main(["--quick"])
    out = capsys.readouterr().out
    for row in ("h5py write", "h5py read", "h5py sha+meta", "kaudit checkpoint"):
        assert row in out
    for row in ("kaudit restore", "kaudit verify", "dcp save", "dcp load"):
        assert row in out
    assert set(ratios) == {"checkpoint", "restore", "verify", "dcp wall", "dcp cpu"}
    assert all(r > 0 for r in ratios.values()), ratios
    assert out.count("PASS") + out.count("MISS") == 5  # timings vary: judged, not asserted
    assert "kaudit checkpoint (4 arrays)" in out
    assert out.count(" us per tensor") == 3  # the cost model: checkpoint, restore, verify


def test_the_levels_benchmark_kills_ranks_and_nodes_and_judges_every_goal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import bench_levels

    figures = bench_levels.main(["--quick"])
    out = capsys.readouterr().out
    assert figures is not None
    assert "baseline: the loop without checkpoints" in out
    assert "one np.copyto of the shard" in out
    assert "baseline: a restart with every shard local" in out
    for key in ("stall", "copyto", "restart_local", "restart_node", "memory"):
        assert figures[key] > 0, figures  # timings vary: measured and printed, not judged
    for key in ("durable_lost", "levels_lost"):
        assert figures[key] >= 0, figures
    # Not timings: after a node loss the shards came from the partners, newer than any
    # durable step, and not one byte of a file of the DVC remote was read.
    assert figures["partner_restored"] == 1.0, out
    assert figures["remote_reads"] == 0, out
    # cost, stall, work lost, restart after a node loss and the remote's reads: judged
    assert out.count("PASS") + out.count("MISS") == 5, out
    assert "the state (0.1875 MiB, 3 shards)" in out
