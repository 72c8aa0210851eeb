"""Redlock: one lock over N independent Redis masters, held when a majority grants it.

The algorithm of the Redis documentation ("Distributed locks with Redis"): an
acquire asks every master at once (the backend's acquire script written to each,
then the replies read, each under a short per-master socket timeout: one round
trip, not one per master); it holds the lock
when at least ``N // 2 + 1`` granted and the time left, ``ttl - elapsed -
drift``, is positive; otherwise it frees what it got on every master and
retries after a random delay. Extend and release ask every master too.

What it does not give: fencing tokens (independent masters' counters cannot be
ordered against each other: Martin Kleppmann's critique of Redlock), listings
(no master knows the others' holders), a fair queue, reentrancy.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...exceptions import BackendUnavailable, InvalidBackendOptions
from ...kinds import Kind
from ..base import (
    Acquisition,
    BaseLockBackend,
    ExcInfo,
    Freed,
    Grant,
    Miss,
    check_option_keys,
)
from .acquisition import Calls
from .client import Redis, Sent
from .errors import REDIS_ERRORS
from .keys import Packed, make_keys
from .scripts import SCRIPTS

if TYPE_CHECKING:
    from ...hold import Hold

_OPTIONS = {"NODE_TIMEOUT"}
_SCHEMES = ("redis://", "rediss://", "unix://")
#: Default per-master socket (and connect) timeout, seconds: a dead master costs
#: this much of an acquire, not the whole of it.
NODE_TIMEOUT = 0.1
#: The clocks of the masters may run this much faster than ours (ratio of the TTL),
#: plus :data:`DRIFT_FLOOR` seconds: the lease counts as this much shorter.
DRIFT = 0.01
DRIFT_FLOOR = 0.002
_KEYS_CACHE = 4096


def _with_timeouts(url: str, timeout: float) -> str:
    """``url`` with ``socket_timeout`` and ``socket_connect_timeout`` unless it sets them."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    for name in ("socket_timeout", "socket_connect_timeout"):
        query.setdefault(name, str(timeout))
    return urlunsplit(parts._replace(query=urlencode(query)))


class RedlockAcquisition(Acquisition):
    """One acquisition on every master; the waits are the base class' backoff."""

    backend: RedlockBackend

    def __init__(
        self,
        hold: Hold,
        token: str,
        blocking: bool,
        deadline: float | None,
    ) -> None:
        super().__init__(hold, token, blocking, deadline)
        self.calls = self.backend.calls_for(hold.key)
        #: An attempt may have been granted on some masters and not given back: its
        #: grant did not reach the handle (a task cancelled while the attempt ran in
        #: its worker thread), or it is still running.
        self._maybe_held = False

    def _drift(self, ttl: float) -> float:
        return ttl * DRIFT + DRIFT_FLOOR

    def attempt(self) -> Grant | Miss:
        lock, calls = self.hold, self.calls
        ttl_ms = max(int(lock.ttl * 1000), 1)
        args = (self.token, ttl_ms, f"{lock.host} {lock.pid} {lock.holder_field}", "", "")
        started = time.monotonic()
        self._maybe_held = True
        try:
            replies = self.backend.call_all(calls.acquire, args)
        except BackendUnavailable:
            self._free()
            raise
        elapsed = time.monotonic() - started
        grants = [reply for reply in replies if reply[0] == 1]
        drift = self._drift(lock.ttl)
        if len(grants) >= self.backend.quorum and lock.ttl - elapsed - drift > 0:
            acquired = datetime.fromtimestamp(grants[0][2] / 1000, UTC)
            # The lease counts from the first request, less the drift: the handle adds
            # ``granted_after`` (negative here) to the time it sent the acquire.
            return Grant(None, acquired, acquired + timedelta(seconds=lock.ttl - drift), -drift)
        self._free()
        waits = [reply[1] for reply in replies if reply[0] != 1 and reply[1] >= 0]
        return Miss(min(waits) / 1000 if waits else None)

    def _free(self) -> None:
        """Give back what a failed attempt got (best effort: unreached masters time out)."""
        with contextlib.suppress(BackendUnavailable):
            self.backend.call_all(self.calls.release, (self.token,))
        self._maybe_held = False

    def close(self) -> None:
        """Give back what an attempt got if its grant never reached the handle. A
        cancelled task's :meth:`aclose` runs this in the worker thread that runs its
        attempts (``sync_to_async``'s one thread), so after the attempt ended."""
        if self._maybe_held:
            self._free()

    def release(self, exc_info: ExcInfo) -> bool:
        calls = self.calls
        replies = self.backend.call_all(calls.release, (self.token,))
        return sum(1 for reply in replies if reply) >= self.backend.quorum

    def extend(self, ttl: float) -> Grant | None:
        calls, ttl_ms = self.calls, max(int(ttl * 1000), 1)
        started = time.monotonic()
        replies = self.backend.call_all(calls.extend, (self.token, ttl_ms))
        elapsed = time.monotonic() - started
        extended = [reply for reply in replies if reply]
        drift = self._drift(ttl)
        if len(extended) < self.backend.quorum or ttl - elapsed - drift <= 0:
            return None
        acquired = datetime.fromtimestamp(extended[0][1] / 1000, UTC)
        now = datetime.fromtimestamp(extended[0][2] / 1000, UTC)
        return Grant(None, acquired, now + timedelta(seconds=ttl - drift), -drift)


class RedlockBackend(BaseLockBackend):
    """Locks held by a majority of independent Redis masters (Redlock).

    ``LOCATION``: a list of at least 3 ``redis://`` (``rediss://``, ``unix://``)
    URLs, or one string of them separated by commas; an odd count tolerates the
    most failures (5 masters: 2 may be down). ``OPTIONS["NODE_TIMEOUT"]``: seconds
    one master may take (default 0.1), used where a URL sets no timeout. See
    ``docs/redis.md``.
    """

    kinds = {Kind.EXCLUSIVE: RedlockAcquisition}
    errors = REDIS_ERRORS
    distributed = True
    supports_expiry = True
    supports_force_release = True
    supports_force_release_by_owner = True
    why_unsupported = {
        "supports_fencing": "independent masters' counters cannot be ordered",
        "supports_leadership": "a term's epoch is a fencing token, and independent masters' "
        "counters cannot be ordered (use RedisBackend, or ZooKeeper)",
        "supports_listing": "no master knows which locks a majority holds",
        "supports_read_write": "shares would need a majority each, and Redlock has no queue "
        "to keep a waiting writer ahead of later readers",
        "supports_semaphore": "permits would need a majority each (use RedisBackend)",
        "supports_waiters": "its waiters retry with backoff in their own processes; no "
        "master keeps a queue of them",
    }

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        check_option_keys(alias, self.options, _OPTIONS)
        location = self.location
        urls = location.split(",") if isinstance(location, str) else location
        if not isinstance(urls, list | tuple) or len(urls) < 3:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['LOCATION'] must list at least 3 Redis URLs (a list, "
                f"or one string separated by commas), got {location!r}."
            )
        urls = [url.strip() if isinstance(url, str) else url for url in urls]
        for url in urls:
            if not isinstance(url, str) or not url.startswith(_SCHEMES):
                raise InvalidBackendOptions(
                    f"DISTLOCK[{alias!r}]['LOCATION']: {url!r} is not a redis://, rediss:// "
                    "or unix:// URL."
                )
        if len(set(urls)) != len(urls):
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['LOCATION'] names a master twice: each must be an "
                "independent server."
            )
        timeout = self.options.get("NODE_TIMEOUT", NODE_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['OPTIONS']['NODE_TIMEOUT'] must be a number of seconds > 0."
            )
        if "{" in self.key_prefix or "}" in self.key_prefix:
            raise InvalidBackendOptions(
                f"DISTLOCK[{alias!r}]['KEY_PREFIX'] must not contain '{{' or '}}'."
            )
        self.masters = [Redis(_with_timeouts(url, timeout), None, False) for url in urls]
        self.quorum = len(urls) // 2 + 1
        self._calls: dict[str, Calls] = {}

    def calls_for(self, key: str) -> Calls:
        calls = self._calls.get(key)
        if calls is None:
            if len(self._calls) >= _KEYS_CACHE:
                self._calls.clear()
            # no master lists: the release leaves the index alone
            calls = self._calls[key] = Calls.of(make_keys(self.key_prefix, key, 1), False)
        return calls

    def on_masters(self, run: Callable[[Redis], Any]) -> tuple[list[Any], list[BaseException]]:
        """Run ``run`` on every master in turn: the replies of those that answered,
        and the errors of the others.

        :raises BackendUnavailable: when fewer than a majority answered.
        """
        replies: list[Any] = []
        errors: list[BaseException] = []
        for master in self.masters:
            try:
                replies.append(run(master))
            except BackendUnavailable as exc:
                errors.append(exc)
        self._check_majority(replies, errors)
        return replies, errors

    def call_all(self, packed: Packed, args: tuple[str | int, ...]) -> list[Any]:
        """Run a packed script call on every master at once (written to all, then the
        replies read): one round trip, not one per master. Returns the replies of the
        masters that answered.

        :raises BackendUnavailable: when fewer than a majority answered.
        """
        started: list[tuple[Redis, Sent]] = []
        errors: list[BaseException] = []
        for master in self.masters:
            try:
                started.append((master, master.start(packed, args)))
            except BackendUnavailable as exc:
                errors.append(exc)
        replies: list[Any] = []
        for master, sent in started:
            try:
                replies.append(master.finish(sent, packed, args, None))
            except BackendUnavailable as exc:
                errors.append(exc)
        self._check_majority(replies, errors)
        return replies

    def _check_majority(self, replies: list[Any], errors: list[BaseException]) -> None:
        if len(replies) < self.quorum:
            raise BackendUnavailable(
                f"Redlock {self.alias!r}: only {len(replies)} of {len(self.masters)} Redis "
                f"masters answered; {self.quorum} are needed. First error: {errors[0]}"
            ) from errors[0]

    def is_locked(self, name: str) -> bool:
        lock_key = self.calls_for(self.make_key(name)).keys.lock

        replies, _ = self.on_masters(lambda master: int(master.command("exists", lock_key)))
        return sum(replies) >= self.quorum

    def _force_release(self, key: str, owner: str) -> Freed | None:
        k = self.calls_for(key).keys
        replies, _ = self.on_masters(
            lambda m: m.run(
                SCRIPTS["force_release"],
                (k.lock, k.queue, k.waiters, k.listing),
                (k.member, owner),
            )
        )
        return Freed() if any(replies) else None

    def health(self) -> float:
        started = time.monotonic()

        self.on_masters(lambda master: master.command("ping"))
        return time.monotonic() - started

    def close(self) -> None:
        for master in self.masters:
            master.close()
