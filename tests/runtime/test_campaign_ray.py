"""run.map_batches on Ray (ka.RayExecutor): a real local Ray cluster of 2 CPUs, started once
for the module, and a Ray worker process killed with SIGKILL mid-campaign. Ray runs the
lost task again; the ledger keeps every batch once, the tally is bitwise a serial run's,
and the certificate verifies."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.project.repository import Project
from kronos_audit.statement.campaign import read_certificate
from kronos_audit.verification.records import stored_batches
from tests.helpers import run_cli
from tests.runtime.test_campaign import SEED, add, batch, same, serial_tally

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a Ray cluster takes some 10 s to start on 2 cores
N = 24
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray cluster for the module: its workers import this test module (the
    batches' functions) from the repository."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), before) if p)
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no token written to the user's home
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _kill_once(rng: np.random.Generator, samples: int, marks: str) -> dict[str, Any]:
    if rng.bit_generator.seed_seq.spawn_key[0] == 5 and not Path(marks, "killed").exists():  # type: ignore[attr-defined]
        Path(marks, "killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the Ray worker process, for real
    return batch(rng, samples)


def test_on_ray_a_killed_worker_costs_nothing_and_a_failing_batch_stops_the_campaign(
    cluster: None, project: Project, key: ka.SigningKey, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    with ka.Run("ray", root=project.root / "checkpoints", seed=SEED, every=ka.EverySteps(5)) as run:
        ledger = run.map_batches(
            _kill_once, N, executor=ka.RayExecutor(), samples=500, marks=str(marks)
        )
        assert ledger.indices() == list(range(N))
        tally: dict[str, Any] = ledger.reduce(add)
    assert (marks / "killed").exists()
    assert same(tally, serial_tally())
    cert = project.root / "checkpoints" / "ray.campaign.json"
    verified = run_cli("verify", str(cert))
    assert verified.exit_code == 0, verified.output
    batches = stored_batches(cert, read_certificate(cert).record)
    assert [b.index for b in batches] == list(range(N))
    workers = {b.worker for b in batches}
    assert len(workers) >= 2, workers  # Ray's worker processes, not this one
    assert f":{os.getpid()}" not in "".join(workers)
    # A batch that raises is the batch's failure: the campaign stops, naming it.
    with (
        ka.Run("ray-fails", root=project.root / "checkpoints", seed=SEED) as run,
        pytest.raises(ka.CampaignError, match=r"stopped: batch 7: ValueError: no data; 23 of 24"),
    ):
        run.map_batches(_raises_at_7, N, executor=ka.RayExecutor(max_retries=0), samples=50)
    assert 7 not in run.ledger


def _raises_at_7(rng: np.random.Generator, samples: int) -> dict[str, Any]:
    if rng.bit_generator.seed_seq.spawn_key[0] == 7:  # type: ignore[attr-defined]
        raise ValueError("no data")
    return batch(rng, samples)
