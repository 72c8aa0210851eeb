"""Moved to :mod:`django_distlock.operations.listing`; this path stays for imports that name it."""

from ..operations.listing import (
    CURSOR_SALT,
    READS_PER_PAGE,
    AliasState,
    BadPosition,
    Page,
    Row,
    alias_states,
    backend_type,
    find_lock,
    lock_kind,
    read_page,
    sign_position,
    unsign_position,
)

__all__ = [
    "CURSOR_SALT",
    "READS_PER_PAGE",
    "AliasState",
    "BadPosition",
    "Page",
    "Row",
    "alias_states",
    "backend_type",
    "find_lock",
    "lock_kind",
    "read_page",
    "sign_position",
    "unsign_position",
]
