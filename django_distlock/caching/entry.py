"""What :mod:`django_distlock.caching` stores under a cache key, and when it is due.

An entry is a plain tuple, so that any cache pickles it small and unpickles it
without importing this module: ``(TAG, value, fresh_until, delta, alias, token)``.

- ``fresh_until``: the wall-clock time (``time.time()``, seconds) the value stops
  being fresh; None for a value stored without a timeout.
- ``delta``: how long the build that made it took, in seconds (XFetch's delta).
- ``alias``, ``token``: the ``DISTLOCK`` alias and fencing token of the grant under
  which it was built, or None (built without the lock, or on an alias without
  fencing tokens). A write is refused when the entry already there was built under
  a later grant of the same alias (:func:`supersedes`).

A *tombstone* is an entry without a value (``value`` is :data:`GONE`): what
:func:`~django_distlock.caching.invalidate` leaves, so that a builder that started
before the invalidation cannot write its now outdated value after it.

Freshness uses the wall clock because entries travel between machines (as
dogpile.cache's and the XFetch paper's do); skew between the machines' clocks
shifts when each sees an entry expire, by that skew.
"""

from __future__ import annotations

import math
import random
from typing import Any, Final, TypeGuard

#: First field of every entry: a value a site stored with a plain ``cache.set()`` is
#: never mistaken for one.
TAG: Final = "django_distlock.caching:1"
#: The value field of a tombstone (a str, not an object: it pickles without an import).
GONE: Final = "django_distlock.caching:gone"

#: ``(TAG, value, fresh_until, delta, alias, token)``.
Entry = tuple[str, Any, float | None, float, str | None, int | None]


def pack(
    value: Any, fresh_until: float | None, delta: float, alias: str | None, token: int | None
) -> Entry:
    """Build the entry to store.

    :param value: the built value.
    :param fresh_until: when it stops being fresh (wall clock), None never.
    :param delta: the build's duration in seconds.
    :param alias: the ``DISTLOCK`` alias whose grant it was built under, or None.
    :param token: that grant's fencing token, or None.
    :returns: the entry.
    """
    return (TAG, value, fresh_until, delta, alias, token)


def tombstone(alias: str | None, token: int | None) -> Entry:
    """The entry :func:`~django_distlock.caching.invalidate` stores.

    :param alias: the alias of the invalidating grant, or None.
    :param token: its fencing token, or None.
    :returns: an entry that reads as missing.
    """
    return (TAG, GONE, 0.0, 0.0, alias, token)


def is_entry(stored: object) -> TypeGuard[Entry]:
    """Whether ``stored`` (what the cache returned) is an entry of this module.

    :param stored: a cached value.
    :returns: True for an entry or tombstone.
    """
    return type(stored) is tuple and len(stored) == 6 and stored[0] == TAG


def supersedes(stored: object, alias: str | None, token: int | None) -> bool:
    """Whether ``stored`` was built under a later grant than ``(alias, token)``: then a
    write of the earlier grant's value must be dropped.

    Tokens compare only within one alias (two aliases count their grants apart); a
    write or an entry without a token compares with nothing.

    :param stored: what the cache holds now (anything).
    :param alias: the writer's alias.
    :param token: the writer's fencing token.
    :returns: True when the stored entry's token is the larger one.
    """
    if token is None or not is_entry(stored):
        return False
    return stored[4] == alias and stored[5] is not None and stored[5] > token


def due(fresh_until: float | None, delta: float, beta: float, now: float) -> bool:
    """XFetch's test (Vattani, Chierichetti, Lowenstein, VLDB 2015): whether a caller
    reading a still-fresh entry at ``now`` should rebuild it early.

    ``now - delta * beta * ln(u) >= fresh_until`` for ``u`` uniform in (0, 1]: the
    closer the expiry and the longer the last build took, the likelier; with many
    callers, one usually rebuilds a hot key before it expires at all.

    :param fresh_until: the entry's freshness end (None: never due).
    :param delta: the last build's duration in seconds.
    :param beta: the paper's beta (0: never early; above 1 earlier).
    :param now: the wall-clock time.
    :returns: True when this caller should rebuild now.
    """
    if fresh_until is None or beta <= 0.0 or delta <= 0.0:
        return False
    return now - delta * beta * math.log(1.0 - random.random()) >= fresh_until
