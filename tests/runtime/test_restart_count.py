"""kronos_audit.supervise.protocol.restart_count: the count a manifest records, from the
layers that restart a job (Slurm's requeue or ``kaudit run``, and torchrun inside either).

Real runs: tests/parallel/test_elastic_torch.py (torchrun's restart recorded), and
tests/slurm/test_requeue.py (Slurm's)."""

from __future__ import annotations

import pytest

from kronos_audit.supervise.protocol import restart_count

VARIABLES = ("SLURM_RESTART_COUNT", "KAUDIT_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in VARIABLES:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 0),
        ({"KAUDIT_RESTART_COUNT": "2"}, 2),
        ({"SLURM_RESTART_COUNT": "3", "KAUDIT_RESTART_COUNT": "2"}, 3),  # Slurm's wins
        ({"TORCHELASTIC_RESTART_COUNT": "0"}, 0),  # torchrun, nothing restarted
        ({"TORCHELASTIC_RESTART_COUNT": "1"}, 1),  # torchrun re-formed the job once
        # torchrun restarts inside one run of the job, counting from 0 in each: added
        ({"KAUDIT_RESTART_COUNT": "2", "TORCHELASTIC_RESTART_COUNT": "1"}, 3),
        ({"SLURM_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "2"}, 3),
        # what is not a decimal count counts as absent
        ({"SLURM_RESTART_COUNT": "x", "KAUDIT_RESTART_COUNT": "2"}, 2),
        ({"TORCHELASTIC_RESTART_COUNT": "-1"}, 0),
        ({"TORCHELASTIC_RESTART_COUNT": "\u0661"}, 0),  # an Arabic-Indic one: not ASCII
        ({"TORCHELASTIC_RESTART_COUNT": "9" * 40}, 0),
        ({"KAUDIT_RESTART_COUNT": ""}, 0),
    ],
)
def test_restart_count_adds_torchruns_count_to_the_jobs(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: int
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert restart_count() == expected
