"""The settings of a ZooKeeper alias: ``LOCATION`` and ``OPTIONS``, checked without I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core import checks

from ...exceptions import InvalidBackendOptions
from ..base import check_option_keys

_OPTIONS = {
    "ROOT", "SESSION_TIMEOUT", "CONNECT_TIMEOUT", "AUTH", "ACL", "CLIENT_OPTIONS",
    "MAX_SESSION_BYTES",
}
#: ZooKeeper's default ``jute.maxbuffer``. When a session ends, ZooKeeper 3.6+ writes one
#: transaction naming all its ephemeral nodes; one larger than about twice this breaks the
#: ensemble (ZOOKEEPER-4306), so a session's nodes' paths are kept under it.
DEFAULT_MAX_SESSION_BYTES = 0xFFFFF
#: KazooClient arguments the backend sets itself.
_OWN_KWARGS = {"hosts", "timeout", "auth_data", "default_acl", "handler"}
DEFAULT_ROOT = "/django-distlock"
DEFAULT_SESSION_TIMEOUT = 10.0
#: What a server with the default ``tickTime`` (2 s) accepts: 2 to 20 ticks.
MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT = 4.0, 40.0
_HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(:\d{1,5})?$")
_CHROOT = re.compile(r"^(/[^/\x00-\x1f]+)+$")
_ACL_PERMS = {"READ", "WRITE", "CREATE", "DELETE", "ADMIN", "ALL"}


@dataclass(frozen=True)
class Problem:
    """A setting a system check reports, and that ``acquire()`` refuses before any I/O."""

    id: str
    message: str
    hint: str

    def error(self, alias: str) -> checks.Error:
        return checks.Error(self.message, hint=self.hint, obj=alias, id=self.id)


@dataclass(frozen=True)
class ZooKeeperSettings:
    hosts: str
    root: str
    session_timeout: float
    connect_timeout: float
    #: (username, password) of digest auth, or None.
    auth: tuple[str, str] | None
    #: Extra ``(scheme, id, perms)`` ACL entries besides the digest user's.
    acl: tuple[tuple[str, str, tuple[str, ...]], ...]
    client_options: Mapping[str, Any] = field(default_factory=dict)
    problems: tuple[Problem, ...] = ()
    #: Most bytes of node paths the locks of one session may hold (MAX_SESSION_BYTES).
    max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES


def hosts_problem(hosts: object) -> str | None:
    """Why ``hosts`` is not a ZooKeeper connection string, or None."""
    if not isinstance(hosts, str) or not hosts:
        return "LOCATION must be a non-empty hosts string such as 'zk1:2181,zk2:2181,zk3:2181'."
    servers, slash, chroot = hosts.partition("/")
    if slash and not _CHROOT.match("/" + chroot):
        return f"LOCATION {hosts!r} has a malformed chroot path after its hosts."
    for server in servers.split(","):
        match = _HOST.match(server.strip())
        if not match:
            return f"LOCATION {hosts!r}: {server!r} is not host or host:port."
        port = match.group(2)
        if port and not 1 <= int(port[1:]) <= 65535:
            return f"LOCATION {hosts!r}: port {port[1:]} is out of range."
    return None


def root_problem(root: object) -> str | None:
    """Why ``root`` cannot hold the lock nodes, or None."""
    if not isinstance(root, str):
        return "OPTIONS['ROOT'] must be a str path such as '/django-distlock'."
    if not _CHROOT.match(root) or root.endswith("/"):
        return f"OPTIONS['ROOT'] {root!r} must be an absolute path without a trailing slash."
    parts = root.split("/")[1:]
    if any(part in (".", "..") for part in parts):
        return f"OPTIONS['ROOT'] {root!r} must not contain '.' or '..'."
    if parts[0] == "zookeeper":
        return f"OPTIONS['ROOT'] {root!r} is under /zookeeper, which ZooKeeper reserves."
    return None


def parse(alias: str, location: object, options: Mapping[str, Any]) -> ZooKeeperSettings:
    """Read an alias' settings; raise InvalidBackendOptions for wrong types and keys, and
    record the problems the system checks report (malformed hosts, bad root, session
    timeout out of range) for ``check()`` and for ``acquire()`` to refuse."""
    where = f"DISTLOCK[{alias!r}]"
    check_option_keys(alias, options, _OPTIONS)
    problems: list[Problem] = []
    bad_hosts = hosts_problem(location)
    if bad_hosts:
        problems.append(Problem(
            "distlock.E020", f"{where}: {bad_hosts}",
            "Give the ensemble's servers as 'host:port,host:port' (an optional /chroot last).",
        ))
    root = options.get("ROOT", DEFAULT_ROOT)
    bad_root = root_problem(root)
    if bad_root:
        problems.append(Problem(
            "distlock.E021", f"{where}: {bad_root}", "Use a path such as '/django-distlock'.",
        ))
    session_timeout = _seconds(where, options, "SESSION_TIMEOUT", DEFAULT_SESSION_TIMEOUT)
    if not MIN_SESSION_TIMEOUT <= session_timeout <= MAX_SESSION_TIMEOUT:
        problems.append(Problem(
            "distlock.E022",
            f"{where}['OPTIONS']['SESSION_TIMEOUT'] is {session_timeout:g} s; a ZooKeeper "
            f"server with the default tickTime accepts {MIN_SESSION_TIMEOUT:g} to "
            f"{MAX_SESSION_TIMEOUT:g} s and would silently use the nearest bound.",
            "Choose a value in that range (a holder's crash frees its locks after it).",
        ))
    connect_timeout = _seconds(where, options, "CONNECT_TIMEOUT", session_timeout)
    auth = options.get("AUTH")
    if auth is not None:
        if (
            not isinstance(auth, list | tuple) or len(auth) != 2
            or not all(isinstance(part, str) and part for part in auth) or ":" in auth[0]
        ):
            raise InvalidBackendOptions(
                f"{where}['OPTIONS']['AUTH'] must be (username, password) of digest auth, "
                "the username without ':'."
            )
        auth = (auth[0], auth[1])
    acl = _acl(where, options.get("ACL", ()))
    max_bytes = options.get("MAX_SESSION_BYTES", DEFAULT_MAX_SESSION_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1024:
        raise InvalidBackendOptions(
            f"{where}['OPTIONS']['MAX_SESSION_BYTES'] must be an int of at least 1024 "
            f"(bytes), got {max_bytes!r}."
        )
    client_options = options.get("CLIENT_OPTIONS", {})
    if not isinstance(client_options, Mapping):
        raise InvalidBackendOptions(f"{where}['OPTIONS']['CLIENT_OPTIONS'] must be a dict.")
    own = _OWN_KWARGS & set(client_options)
    if own:
        raise InvalidBackendOptions(
            f"{where}['OPTIONS']['CLIENT_OPTIONS'] sets {sorted(own)}, which the backend "
            "sets from LOCATION, SESSION_TIMEOUT, AUTH and ACL."
        )
    return ZooKeeperSettings(
        hosts=location if isinstance(location, str) else "",
        root=root if not bad_root else DEFAULT_ROOT,
        session_timeout=session_timeout,
        connect_timeout=connect_timeout,
        auth=auth,
        acl=acl,
        client_options=dict(client_options),
        problems=tuple(problems),
        max_session_bytes=max_bytes,
    )


def _seconds(where: str, options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 3600:
        raise InvalidBackendOptions(
            f"{where}['OPTIONS'][{key!r}] must be a number of seconds above 0, got {value!r}."
        )
    return float(value)


def _acl(where: str, entries: object) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    message = (
        f"{where}['OPTIONS']['ACL'] must be a list of (scheme, id, perms) entries, perms "
        f"a list from {sorted(_ACL_PERMS)}."
    )
    if not isinstance(entries, list | tuple):
        raise InvalidBackendOptions(message)
    out = []
    for entry in entries:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise InvalidBackendOptions(message)
        scheme, ident, perms = entry
        if (
            not isinstance(scheme, str) or not isinstance(ident, str)
            or not isinstance(perms, list | tuple) or not perms
            or not set(perms) <= _ACL_PERMS
        ):
            raise InvalidBackendOptions(message)
        out.append((scheme, ident, tuple(perms)))
    return tuple(out)
