"""Validation of lock names, shared by every backend."""

from __future__ import annotations

import unicodedata

from .exceptions import InvalidLockName

#: Longest accepted lock name, in characters, before the alias' ``KEY_PREFIX``.
MAX_NAME_LENGTH = 200
#: Longest accepted ``KEY_PREFIX``.
MAX_PREFIX_LENGTH = 50


def validate_name(name: object) -> str:
    """Return ``name`` if it is a usable lock name, else raise :class:`InvalidLockName`.

    A name is a non-empty ``str`` of at most :data:`MAX_NAME_LENGTH`
    characters, encodable as UTF-8, with no control characters (NUL, newline,
    DEL, ...). ``/``, ``..``, spaces and any other printable character are
    allowed: each backend stores names verbatim or encodes them safely.
    """
    if not isinstance(name, str):
        raise InvalidLockName(f"A lock name must be a str, not {type(name).__name__}.")
    if not name:
        raise InvalidLockName("A lock name must not be empty.")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidLockName(
            f"A lock name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}."
        )
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
