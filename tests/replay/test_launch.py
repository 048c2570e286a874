"""How a replay starts the ranks of a step and reports their failure, without starting
any: the torchrun it picks, and the lines of a failed command's stderr it shows."""

from __future__ import annotations

from pathlib import Path

from kronos_audit.replay.command import _tail
from kronos_audit.replay.launch import torchrun

# What torchrun writes to stderr when a worker fails (its agent's warnings, the workers'
# own lines, then the agent's failure line, traceback and summary), shortened.
AGENT = "torch/distributed/elastic/multiprocessing/api.py"
TORCHRUN_STDERR = "\n".join(
    [
        "W1202 01:11:37.949000 24187 torch/distributed/run.py:874] ************************",
        "W1202 01:11:37.949000 24187 torch/distributed/run.py:874] Setting OMP_NUM_THREADS",
        "the program gave up: no data in /data/run-7",
        f"W1202 01:11:38.101000 24187 {AGENT}:908] Sending process 24193 closing signal",
        f"E1202 01:11:38.347000 24187 {AGENT}:1002] failed (exitcode: 1) local_rank: 0",
        "Traceback (most recent call last):",
        '  File "/venv/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "fail.py FAILED",
        "------------------------------------------------------------",
        "  exitcode  : 1 (pid: 24192)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
        "",
    ]
)


def test_torchrun_is_found_beside_the_interpreter_else_run_as_its_module(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python3").touch()
    (venv / "torchrun").touch()
    assert torchrun(str(venv / "python3")) == [str(venv / "torchrun")]
    elsewhere = str(tmp_path / "bin" / "python3")
    assert torchrun(elsewhere) == [elsewhere, "-m", "torch.distributed.run"]


def test_a_failed_torchrun_shows_what_the_workers_said_not_the_agents_report(
    tmp_path: Path,
) -> None:
    log = tmp_path / "stderr.log"
    log.write_text(TORCHRUN_STDERR)
    assert _tail(log) == "the program gave up: no data in /data/run-7"


def test_any_other_command_shows_its_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_text("starting\n\nstep 3\n  ValueError: bad input\nTraceback done\n")
    assert _tail(log) == "step 3 | ValueError: bad input | Traceback done"
