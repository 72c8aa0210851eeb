"""Lock names as znode names, and the names of the contender nodes under them.

A lock is a parent node ``ROOT/<encoded key>`` (a container node) whose children
are the contenders: ``<guid>__lock__<sequence>`` (``__rlock__`` for readers),
ephemeral and sequential, the lowest sequence holding the lock (kazoo's ``Lock``,
``ReadLock`` and ``WriteLock`` recipes name them the same way). A write holder's own
read node (a downgrade) carries its write node's sequence and queues right after it.
"""

from __future__ import annotations

import re

#: Separates a contender's GUID from the sequence number ZooKeeper appends; says what it
#: takes: the lock (exclusive or write side), or its read side (kazoo's names too).
MARKER = "__lock__"
READ_MARKER = "__rlock__"
#: A semaphore's lease (kazoo's ``Semaphore`` names its leases freely; these sort).
LEASE_MARKER = "__lease__"
#: The child of a semaphore's parent under which its waiters queue for the gate.
GATE = "__gate__"
_SEQUENCE_DIGITS = 10
_SAFE = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:.,;=+@!~*()[]{}<> '\"$&#^|`?"
)


def _needs_escape(char: str) -> bool:
    if char in _SAFE:
        return False
    code = ord(char)
    # ZooKeeper refuses NUL, control characters, surrogates, private use and U+FFF0+
    # (PathUtils.validatePath); everything else outside ASCII is kept readable.
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xF8FF
        or code >= 0xFFF0
        or char in "/%"
    )


def encode(key: str) -> str:
    """Return the znode name of a storage key: readable, valid, one name per key.

    ``%`` and what ZooKeeper refuses (``/``, control characters, ...) become
    ``%XX`` (``%uXXXX``/``%UXXXXXXXX`` past ``\\xff``); a name that is only
    dots, or ``zookeeper``, has its first character escaped. Decoding undoes
    it, so two keys never share a node.
    """
    out = []
    for char in key:
        if _needs_escape(char):
            code = ord(char)
            out.append(
                f"%{code:02X}" if code <= 0xFF
                else f"%u{code:04X}" if code <= 0xFFFF else f"%U{code:08X}"
            )
        else:
            out.append(char)
    name = "".join(out)
    if name.strip(".") == "" or name == "zookeeper":
        name = f"%{ord(name[0]):02X}{name[1:]}"
    return name


_ESCAPE = re.compile(r"%(?:u([0-9A-F]{4})|U([0-9A-F]{8})|([0-9A-F]{2}))")


def decode(name: str) -> str:
    """Return the storage key of a znode name made by :func:`encode`."""
    if "%" not in name:  # most names: listings decode every lock's name
        return name
    return _ESCAPE.sub(lambda m: chr(int(m.group(1) or m.group(2) or m.group(3), 16)), name)


def sequence_of(child: str) -> int:
    """The sequence number ZooKeeper appended to a contender's name (-1 if none)."""
    tail = child[-_SEQUENCE_DIGITS:]
    marked = MARKER in child or READ_MARKER in child or LEASE_MARKER in child
    return int(tail) if marked and tail.isdigit() else -1


def downgrade_marker(write_node: str) -> str:
    """The marker of a read node that the holder of ``write_node`` takes (a downgrade):
    ``__rlock__<the write node's sequence>d``, so that it sorts right after that write
    node, ahead of every contender queued behind it (kazoo's sort, by the text after the
    marker, agrees)."""
    return f"{READ_MARKER}{sequence_of(write_node):0{_SEQUENCE_DIGITS}d}{_DOWNGRADE}"


_DOWNGRADE = "d"
_DOWNGRADE_TAIL = 2 * _SEQUENCE_DIGITS + len(_DOWNGRADE)


def _order_key(child: str) -> tuple[int, int]:
    """Where a contender queues: its sequence; a downgrade's right after its write node."""
    tail = child[-_DOWNGRADE_TAIL:]
    if (
        READ_MARKER + tail in child and tail[_SEQUENCE_DIGITS] == _DOWNGRADE
        and tail[:_SEQUENCE_DIGITS].isdigit()
    ):
        return int(tail[:_SEQUENCE_DIGITS]), 1
    return sequence_of(child), 0


def is_read(child: str) -> bool:
    """Whether a contender takes the read side (it shares with other readers)."""
    return READ_MARKER in child


def blocker(order: list[str], node: str) -> str | None:
    """The contender ``node`` waits for, None if it holds: a writer waits for the one
    just ahead; a reader for the nearest writer ahead (readers share)."""
    index = order.index(node)
    if not is_read(node):
        return order[index - 1] if index else None
    writers = [child for child in order[:index] if not is_read(child)]
    return writers[-1] if writers else None


def holders(order: list[str]) -> list[str]:
    """The contenders that hold the lock now: the first, or the leading readers."""
    if order and LEASE_MARKER in order[0]:
        return [child for child in order if LEASE_MARKER in child]
    if not order or not is_read(order[0]):
        return order[:1]
    return [child for child in order if blocker(order, child) is None]


def contenders(children: list[str]) -> list[str]:
    """The contender nodes among ``children``, in queue order (the holder first)."""
    return sorted((c for c in children if sequence_of(c) >= 0), key=_order_key)


def guid_of(child: str) -> str:
    """The GUID part of a contender's name."""
    return child.partition("__")[0]
