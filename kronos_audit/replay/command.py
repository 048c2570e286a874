"""The recorded command, run with a replay's instruction.

The instruction is "resume from this checkpoint, stop at step N, write into this
directory": environment variables (``KAUDIT_RESUME_FROM``, ``KAUDIT_STOP_AT``,
``KAUDIT_OUT``, ``KAUDIT_SEED``) that the Python API honours, and placeholders in the
recorded argv (``{resume_from}``, ``{stop_at}``, ``{out}``, ``{seed}``) for a program that
does not use it, each substituted only as a whole argument or an option's value, never
spliced into a string (:func:`check_placeholders`). The command runs with its output in
log files; then :func:`find_output` finds the checkpoint it wrote.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kronos_audit.checkpoint.layout import checkpoint_name, named_step
from kronos_audit.errors import ReplayError, Stage
from kronos_audit.statement.manifest import Manifest
from kronos_audit.supervise.protocol import ReplayInstruction

Instruction = ReplayInstruction
"""What the replayed command is told: the protocol's one instruction type, written here as
environment variables and placeholders, read back by the program's
:class:`~kronos_audit.runtime.run.Run`."""

PYTHON_NAMES = frozenset({"python", "python3"})
"""A recorded argv starting with one of these runs with this interpreter (sys.executable)."""
PLACEHOLDERS = ("{resume_from}", "{stop_at}", "{out}", "{seed}")
_OPTION_VALUE = re.compile(r"(--?[A-Za-z0-9][A-Za-z0-9_.-]*)=(\{[a-z_]+\})")
"""``--name={placeholder}``: an option, ``=``, a placeholder at the end, nothing else."""
SHOWN_CONTEXT = 40
"""Characters of a refused argument shown on each side of its placeholder."""
STDERR_TAIL_LINES = 3


def _shown(arg: str, at: int) -> str:
    """An argument quoted on one line (a script given to ``sh -c`` may span many lines),
    cut to the text around position ``at`` when long."""
    start, end = max(0, at - SHOWN_CONTEXT), min(len(arg), at + SHOWN_CONTEXT)
    return ("..." if start else "") + repr(arg[start:end]) + ("..." if end < len(arg) else "")


def check_placeholders(recorded: Sequence[str], *, path: Path | None = None) -> None:
    """Refuse a recorded argv with a placeholder inside a larger argument.

    A placeholder is substituted only as a whole argument (``{out}``) or as the value of an
    option (``--out={out}``): a value spliced into a string that a shell parses (``sh -c
    "... {resume_from} ..."``) would be parsed as shell code, and a parent checkpoint in a
    directory named ``x;rm -rf ~;`` would run it. The argv is signed, so it cannot be
    repaired here; it is refused before anything runs (``ReplayError``, stage ``run``).
    """
    for i, arg in enumerate(recorded):
        if arg in PLACEHOLDERS or _option_placeholder(arg) is not None:
            continue
        inside = sorted((arg.find(name), name) for name in PLACEHOLDERS if name in arg)
        if inside:
            at, name = inside[0]
            raise ReplayError(
                f"argument {i} of the recorded command, {_shown(arg, at)}, has {name} inside "
                "it: placeholders must be whole arguments ({out}) or an option's value "
                "(--out={out}), never spliced into a string; a shell command reads the "
                'environment variables instead, quoted ("$KAUDIT_RESUME_FROM"), which the '
                "shell does not parse again",
                path=path,
                stage=Stage.RUN,
            )


def _option_placeholder(arg: str) -> tuple[str, str] | None:
    """``("--name", "{placeholder}")`` for an argument ``--name={placeholder}``, else None."""
    match = _OPTION_VALUE.fullmatch(arg)
    if match is None or match.group(2) not in PLACEHOLDERS:
        return None
    return match.group(1), match.group(2)


def command_line(
    recorded: Sequence[str],
    instruction: Instruction,
    *,
    repo_root: Path,
    tree: Path,
    manifest: Path | None = None,
) -> list[str]:
    """The argv to run: ``python`` resolved to this interpreter, absolute paths into the
    recorded repository moved into the worktree, then the placeholders substituted, each
    as a whole argument or an option's value (see :func:`check_placeholders`, which
    refuses any other use; ``manifest`` is named in that error)."""
    check_placeholders(recorded, path=manifest)
    values = instruction.placeholders()
    argv = []
    for arg in recorded:
        option = _option_placeholder(arg)
        if arg in values:
            arg = values[arg]
        elif option is not None:
            arg = f"{option[0]}={values[option[1]]}"
        else:
            p = Path(arg)
            if p.is_absolute() and p.is_relative_to(repo_root):
                arg = str(tree / p.relative_to(repo_root))
        argv.append(arg)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    return argv


TORCHRUN_FAILED = re.compile(r"[EW]\d{4} [\d:.]+ +\d+ torch/distributed/elastic/\S+\] failed ")
"""The line torchrun's agent writes when a worker failed: after it come the agent's own
traceback and its summary table, none of them what the program said."""
TORCHRUN_LOG = re.compile(r"[IWE]\d{4} [\d:.]+ +\d+ torch/distributed/")
"""A line of torchrun's agent's own log (glog format), between the workers' lines."""


def _tail(path: Path) -> str:
    """The last lines the command wrote to stderr, on one line; under torchrun, the last
    the workers wrote before the agent's report of their failure."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    failed = next((i for i, line in enumerate(lines) if TORCHRUN_FAILED.match(line)), None)
    if failed is not None:
        lines = [line for line in lines[:failed] if not TORCHRUN_LOG.match(line)] or lines
    return " | ".join(lines[-STDERR_TAIL_LINES:])


def find_output(out: Path, step: int) -> Path:
    """The checkpoint the command wrote: ``{out}/step-<N:08d>.h5``, else the one file in
    ``{out}`` (names starting with ``.`` are ignored), unless that one is another step's."""
    expected = out / checkpoint_name(step)
    if expected.is_file():
        return expected
    files = sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ReplayError(
            f"the command exited 0 but wrote no checkpoint (expected {expected.name} in "
            f"the {{out}} directory)",
            stage=Stage.OUTPUT,
        )
    if len(files) > 1:
        names = ", ".join(p.name for p in files[:5])
        raise ReplayError(
            f"the command wrote {len(files)} files ({names}) but no {expected.name}: "
            "cannot tell which is the checkpoint",
            stage=Stage.OUTPUT,
        )
    named = named_step(files[0].name)
    if named is not None and named != step:
        raise ReplayError(
            f"the command stopped at step {named}, not at step {step} "
            "(does its own step count end before it?)",
            stage=Stage.OUTPUT,
        )
    return files[0]


def run_command(
    argv: list[str], run_dir: Path, instruction: Instruction, workdir: Path, m: Manifest
) -> None:
    """Run the command; its output goes to ``stdout.log`` and ``stderr.log`` in ``workdir``."""
    instruction.out.mkdir()
    stderr_log = workdir / "stderr.log"
    try:
        with open(workdir / "stdout.log", "wb") as so, open(stderr_log, "wb") as se:
            status = subprocess.run(
                argv,
                cwd=run_dir,
                env=instruction.environ(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=so,
                stderr=se,
            ).returncode
    except OSError as e:
        raise ReplayError(
            f"cannot run the recorded command {argv[0]!r}: {e.strerror or e}",
            path=m.path,
            stage=Stage.RUN,
        ) from None
    if status == 0:
        return
    how = f"exited with status {status}"
    if status < 0:
        try:
            how = f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            how = f"was killed by signal {-status}"
    tail = _tail(stderr_log)
    raise ReplayError(
        f"could not replay: the command {how}"
        + (f"; its stderr ends: {tail}" if tail else " and wrote nothing to stderr"),
        path=m.path,
        stage=Stage.RUN,
    )
