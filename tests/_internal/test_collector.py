"""The cycle collector held off within a block, nested and across threads, and given back."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from kronos_audit._internal.collector import collection_deferred, deferring_collection


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_no_collection_starts_within_the_block_and_the_collector_comes_back(
    collector_on: None,
) -> None:
    with collection_deferred():
        assert not gc.isenabled()
        with collection_deferred():  # nested: one hold
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError, match="inside"), collection_deferred():
        raise ValueError("inside")
    assert gc.isenabled()  # given back when the block raises too


def test_concurrent_blocks_share_the_hold_until_the_last_ends(collector_on: None) -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with collection_deferred():
            entered.set()
            release.wait()

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait()
    with collection_deferred():
        pass
    assert not gc.isenabled()  # the other thread's block still holds it
    release.set()
    thread.join()
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off(collector_on: None) -> None:
    gc.disable()

    @deferring_collection
    def work(x: int) -> int:
        return x + 1

    assert work(1) == 2
    assert not gc.isenabled()
