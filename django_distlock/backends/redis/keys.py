"""The keys of one lock (one hash tag) and the script calls on them, packed once."""

from __future__ import annotations

import zlib
from typing import NamedTuple

from .scripts import Script


class Keys(NamedTuple):
    """The Redis keys of one lock (one hash tag; see :mod:`.scripts`)."""

    lock: str
    queue: str
    waiters: str
    seq: str
    listing: str  # the index of held names
    #: The name as stored (the index member), without the ``KEY_PREFIX``.
    member: str
    #: Prefix of the waiters' signal lists: ``signal + token``.
    signal: str


def make_keys(prefix: str, stored: str, shards: int) -> Keys:
    """The keys of the lock stored as ``stored`` under ``prefix``."""
    tag = "0" if shards == 1 else str(zlib.crc32(stored.encode()) % shards)
    base = f"{prefix}distlock{{{tag}}}"
    return Keys(
        base + "l:" + stored,
        base + "q:" + stored,
        base + "w:" + stored,
        base + "n",
        base + "i",
        stored,
        base + "s:",
    )


def tag_base(prefix: str, tag: int) -> str:
    """The key prefix of one tag (what :func:`make_keys` builds for its locks)."""
    return f"{prefix}distlock{{{tag}}}"


#: ``TIME``, packed.
TIME_COMMAND = b"*1\r\n$4\r\nTIME\r\n"


def bulk(value: str | int) -> bytes:
    """One RESP bulk string."""
    data = value.encode() if isinstance(value, str) else b"%d" % value
    return b"$%d\r\n%s\r\n" % (len(data), data)


class Packed:
    """A script call whose command, SHA, keys and first arguments are packed (RESP)
    once; :meth:`command` adds the arguments that change with each call."""

    __slots__ = ("args", "head", "keys", "script", "size")

    def __init__(self, script: Script, keys: tuple[str, ...], args: tuple[str | int, ...]) -> None:
        self.script, self.keys, self.args = script, keys, args
        parts = ("EVALSHA", script.sha, len(keys), *keys, *args)
        self.size = len(parts)
        self.head = b"".join(bulk(part) for part in parts)

    def command(self, args: tuple[str | int, ...]) -> bytes:
        return b"".join(
            (b"*%d\r\n" % (self.size + len(args)), self.head, *(bulk(a) for a in args))
        )
