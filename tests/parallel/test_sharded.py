"""The pieces of a sharded run that need no launcher: layouts as declared and as recorded
(a signed record is still checked before anything is read by it), and the per-rank seeds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import CheckpointError, UsageError
from kronos_audit.runtime.ranks import joining_seed, rank_seed
from kronos_audit.runtime.steps.layouts import expand_layout
from kronos_audit.statement.layout import Recorded, parse_layout

FLAT: dict[str, Any] = {
    "/fields/u": np.zeros((4, 3)),
    "/fields/v": np.zeros((4, 3)),
    "/time": np.float64(0.5),
    "/kaudit/tree": np.bytes_(b"{}"),
}


def test_a_layout_key_covers_every_dataset_at_or_under_it() -> None:
    got = expand_layout({"fields": ka.Block(axis=1), "time": ka.Replicated()}, FLAT)
    assert got == {
        "/fields/u": ka.Block(1),
        "/fields/v": ka.Block(1),
        "/time": ka.Replicated(),
    }
    assert expand_layout({"fields/u": ka.Block(0)}, FLAT) == {"/fields/u": ka.Block(0)}
    assert expand_layout(None, FLAT) == {}


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"w": ka.Block(0)}, "layout['w']: no such key in the state"),
        ({"fields/uu": ka.Block(0)}, "no such key"),  # a prefix of a name is not a key
        ({"time": ka.Block(0)}, "Block(axis=0) but /time has 0 dimension(s)"),
        ({"fields/u": ka.Block(2)}, "Block(axis=2) but /fields/u has 2 dimension(s)"),
        ({"kaudit": ka.Replicated()}, "a reserved name"),
        ({"rng": ka.Replicated()}, "a reserved name"),
        ({"time": "block"}, "ka.Block(axis=...) or ka.Replicated(), not str"),
        ({"": ka.Replicated()}, "layout keys are state keys"),
    ],
)
def test_a_bad_layout_is_one_usage_error(layout: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as e:
        expand_layout(layout, FLAT)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_recorded_layout_is_parsed_strictly() -> None:
    assert parse_layout(
        {"fields/u": {"block": 0, "shape": [4, 3]}, "time": {"replicated": True}}
    ) == {"/fields/u": Recorded(0, (4, 3)), "/time": Recorded(None, None)}
    digest = "ab" * 32
    assert parse_layout(
        {
            "u": {"block": 1, "shape": [4, 3], "dtype": "<f8", "digest": digest},
            "t": {"replicated": True, "dtype": "<i8", "shape": [], "digest": digest},
            "s": {"replicated": True, "dtype": "vlen-str", "shape": None, "digest": digest},
        }
    ) == {
        "/u": Recorded(1, (4, 3), "<f8", digest),
        "/t": Recorded(None, (), "<i8", digest),
        "/s": Recorded(None, None, "vlen-str", digest),
    }


@pytest.mark.parametrize(
    "record",
    [
        {"u": {"block": True, "shape": [4]}},  # a bool is not an axis
        {"u": {"block": 1, "shape": [4]}},  # no such axis
        {"u": {"block": 0, "shape": [-1]}},
        {"u": {"block": 0, "shape": [4.0]}},
        {"u": {"block": 0, "shape": "4"}},
        {"u": {"block": 0, "shape": [4], "extra": 1}},
        {"u": {"replicated": 1}},
        {"u": {"replicated": True, "block": 0}},
        # a digest is 64 lower-case hex digits, always with its dtype
        {"u": {"block": 0, "shape": [4], "dtype": "<f8", "digest": "AB" * 32}},
        {"u": {"block": 0, "shape": [4], "dtype": "<f8", "digest": "ab" * 31}},
        {"u": {"block": 0, "shape": [4], "digest": "ab" * 32}},
        {"u": {"block": 0, "shape": [4], "dtype": "<f8"}},
        {"u": {"block": 0, "shape": [4], "dtype": 8, "digest": "ab" * 32}},
        {"u": {"block": 0, "shape": [4], "dtype": "", "digest": "ab" * 32}},
        {"u": {"block": 0, "shape": [4], "dtype": "x" * 70_000, "digest": "ab" * 32}},
        {"u": {"replicated": True, "digest": "ab" * 32, "dtype": "<f8"}},  # no shape
        {"u": {"replicated": True, "digest": "ab" * 32, "dtype": "<f8", "shape": [-1]}},
        {"u": []},
        {"rng/numpy": {"replicated": True}},  # would hand rank 0's generators to every rank
        {"ledger": {"replicated": True}},
        {"kaudit/tree": {"replicated": True}},
    ],
)
def test_a_malformed_or_reserved_recorded_layout_is_one_checkpoint_error(
    record: dict[str, Any],
) -> None:
    with pytest.raises(CheckpointError) as e:
        parse_layout(record)
    assert "\n" not in str(e.value)


def test_rank_zero_keeps_the_run_seed_and_other_ranks_get_their_own_streams() -> None:
    assert rank_seed(1234, 0) == 1234
    seeds = {rank_seed(1234, r) for r in range(1, 50)}
    assert len(seeds) == 49
    assert 1234 not in seeds
    assert rank_seed(1234, 3) == rank_seed(1234, 3)
    assert rank_seed(1234, 3) != rank_seed(1235, 3)


def test_a_rank_joining_at_a_step_gets_a_stream_of_its_own_for_that_step() -> None:
    assert joining_seed(1234, 3, 100) != rank_seed(1234, 3)  # not its draws from step 0
    assert joining_seed(1234, 3, 100) != joining_seed(1234, 3, 200)
    assert joining_seed(1234, 3, 100) != joining_seed(1234, 4, 100)
    assert joining_seed(1234, 3, 100) == joining_seed(1234, 3, 100)
