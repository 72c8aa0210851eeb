"""Lock names: what is accepted, and how a name becomes a storage key."""

from __future__ import annotations

import hashlib
import unicodedata

from .exceptions import InvalidLockName

#: Names up to this many characters are stored as they are; longer ones are stored as
#: their first characters, a separator and their SHA-256 (see :func:`storage_key`).
MAX_STORED_NAME = 200
#: Longest accepted ``KEY_PREFIX``.
MAX_PREFIX_LENGTH = 50
#: Marks a shortened name inside a key. A control character, which no name may hold,
#: so a shortened key never equals the key of a name stored whole.
_SHORTENED = "\x1f"
_DIGEST_HEX = 64
_HEAD = MAX_STORED_NAME - 1 - _DIGEST_HEX


def validate_name(name: object) -> str:
    """Return ``name`` if it is a usable lock name, else raise :class:`InvalidLockName`.

    A name is a non-empty ``str`` of any length, encodable as UTF-8, with no
    control characters (NUL, newline, DEL, ...). ``/``, ``..``, spaces and
    any other printable character are allowed: each backend stores names
    verbatim or encodes them safely.
    """
    if not isinstance(name, str):
        raise InvalidLockName(f"A lock name must be a str, not {type(name).__name__}.")
    if not name:
        raise InvalidLockName("A lock name must not be empty.")
    if name.isprintable():  # no control character, no surrogate: one C call, no loop
        return name
    for index, char in enumerate(name):
        category = unicodedata.category(char)
        if category == "Cc":
            raise InvalidLockName(
                f"A lock name must not contain control characters; found {char!r} "
                f"at position {index}."
            )
        if category == "Cs":
            raise InvalidLockName(
                f"A lock name must be valid Unicode; found a lone surrogate at position {index}."
            )
    return name


def storage_key(name: str) -> str:
    """Return the part of the storage key that stands for a valid ``name``.

    The name itself when it has at most :data:`MAX_STORED_NAME` characters; else
    its first characters, a separator no name can hold, and the SHA-256 of the
    whole name (so distinct names keep distinct keys).
    """
    if len(name) <= MAX_STORED_NAME:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    return f"{name[:_HEAD]}{_SHORTENED}{digest}"


def display_name(stored: str) -> str:
    """Return the name listings show for a stored key part: a shortened one as
    ``head…[sha256:12 hex digits]``."""
    head, sep, digest = stored.partition(_SHORTENED)
    return f"{head}…[sha256:{digest[:12]}]" if sep else stored


def stored_prefix(prefix: str) -> str:
    """Return the part of a listing ``prefix`` that a stored key can be matched on: a
    name over :data:`MAX_STORED_NAME` characters keeps only its first ``_HEAD`` ones
    in its key, so a longer prefix is matched there on its head, then again on the
    names (:func:`listed_under`)."""
    return prefix[:_HEAD]


def listed_under(shown: str, prefix: str) -> bool:
    """Whether the name a listing shows (:func:`display_name`) belongs under ``prefix``:
    a whole name when it starts with it; a shortened one when its head starts like
    ``prefix`` (past its head it cannot be told apart, so it is kept: a listing never
    hides a held lock)."""
    if shown.startswith(prefix):
        return True
    head, _, rest = shown.partition("…[sha256:")
    return len(head) == _HEAD and bool(rest) and prefix.startswith(head)
