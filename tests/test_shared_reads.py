"""``backends.shared_reads``: a block's reads are made once, per thread, and end with it."""

from __future__ import annotations

import threading

import pytest

from django_distlock.backends.shared_reads import read_once, shared_reads


def test_a_key_is_read_once_in_a_block_and_every_time_outside() -> None:
    reads: list[str] = []

    def read(what: str) -> str:
        reads.append(what)
        return what.upper()

    assert read_once("a", lambda: read("a")) == "A"
    assert read_once("a", lambda: read("a")) == "A"
    with shared_reads():
        assert [read_once(k, lambda k=k: read(k)) for k in "aba"] == ["A", "B", "A"]
        with shared_reads():  # an inner block shares the outer one's reads
            assert read_once("b", lambda: read("b")) == "B"
    assert read_once("a", lambda: read("a")) == "A"
    assert reads == ["a", "a", "a", "b", "a"]


def test_a_read_that_failed_is_read_again_and_threads_do_not_share() -> None:
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("down")
        return calls

    with shared_reads():
        with pytest.raises(OSError):
            read_once("k", flaky)
        assert read_once("k", flaky) == 2
        seen: list[int] = []
        thread = threading.Thread(target=lambda: seen.append(read_once("k", flaky)))
        thread.start()
        thread.join()
        assert seen == [3]  # another thread is outside this block
        assert read_once("k", flaky) == 2
