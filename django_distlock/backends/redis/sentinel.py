"""Redis behind Sentinel: a ``LOCATION`` that names the Sentinels, and the clients
that ask them for the master (redis-py's ``SentinelConnectionPool``: every new
connection asks; a connection to a demoted master fails and is made again).

``LOCATION`` is ``redis+sentinel://[user:password@]host:port,host:port/service[/db]``
(``rediss+sentinel://`` for TLS to the master), with the query options
``socket_timeout`` and ``socket_connect_timeout`` (seconds, for the master's
connections) and ``sentinel_password``. A django-redis cache with its
``SentinelClient`` reuses its own pool (see :mod:`.caches`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard
from urllib.parse import parse_qs, unquote

import redis.asyncio.sentinel
import redis.sentinel

from ...exceptions import InvalidBackendOptions

SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
#: The Sentinels' port when ``LOCATION`` gives none.
SENTINEL_PORT = 26379
#: Socket timeout of the connections to the Sentinels: a frozen Sentinel is skipped
#: after this long (redis-py asks the next one).
SENTINEL_TIMEOUT = 1.0
_QUERY = {"socket_timeout", "socket_connect_timeout", "sentinel_password"}


class SentinelLocation(NamedTuple):
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    ssl: bool
    #: Keywords of the master's connections (socket timeouts).
    options: dict[str, float]
    sentinel_password: str | None


def is_sentinel(location: object) -> TypeGuard[str]:
    """Whether ``location`` names Sentinels.

    :param location: a ``LOCATION`` setting (any value).
    :returns: True for a ``redis+sentinel://`` (or ``rediss+sentinel://``) URL.
    """
    return isinstance(location, str) and location.startswith(SCHEMES)


def parse(alias: str, url: str) -> SentinelLocation:
    """Read a ``redis+sentinel://`` URL (no I/O).

    :param alias: the lock alias, for the error message.
    :param url: the ``LOCATION``.
    :returns: what it names.
    :raises InvalidBackendOptions: when it is malformed.
    """
    where = f"DISTLOCK[{alias!r}]['LOCATION']"
    usage = "redis+sentinel://[user:password@]host:port,host:port/service_name[/db]"
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    credentials, _, hosts = netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    parts = [p for p in path.split("/") if p]
    if not hosts or not 1 <= len(parts) <= 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise InvalidBackendOptions(f"{where} must read {usage}, got {url!r}.")
    sentinels = []
    for item in hosts.split(","):
        item = item.strip()
        if item.startswith("["):  # [IPv6]:port
            host, _, port = item[1:].partition("]")
            port = port.removeprefix(":") or str(SENTINEL_PORT)
        else:
            host, sep, port = item.rpartition(":")
            if not sep:
                host, port = item, str(SENTINEL_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidBackendOptions(f"{where}: bad Sentinel address {item!r} in {url!r}.")
        sentinels.append((host, int(port)))
    if len(set(sentinels)) != len(sentinels):
        raise InvalidBackendOptions(f"{where} names a Sentinel twice: {url!r}.")
    given = parse_qs(query, keep_blank_values=True)
    unknown = set(given) - _QUERY
    if unknown:
        raise InvalidBackendOptions(
            f"{where}: unknown query options {sorted(unknown)}; valid are {sorted(_QUERY)}."
        )
    options: dict[str, float] = {}
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in given:
            try:
                options[name] = float(given[name][-1])
            except ValueError:
                options[name] = -1.0
            if not 0 < options[name] < 3600:
                raise InvalidBackendOptions(f"{where}: {name} must be seconds, got {url!r}.")
    return SentinelLocation(
        tuple(sentinels),
        unquote(parts[0]),
        int(parts[1]) if len(parts) == 2 else 0,
        unquote(username) or None,
        unquote(password) or None,
        scheme == "rediss+sentinel",
        options,
        given["sentinel_password"][-1] if "sentinel_password" in given else None,
    )


def master_client(url: str, asyncio: bool = False) -> Any:
    """A client of the master that the Sentinels of ``url`` name (no I/O yet).

    :param url: a ``redis+sentinel://`` ``LOCATION`` (already validated by :func:`parse`).
    :param asyncio: a ``redis.asyncio`` client instead of a sync one.
    :returns: a ``redis.Redis`` (or ``redis.asyncio.Redis``) on a Sentinel pool.
    """
    loc = parse("", url)
    kwargs: dict[str, Any] = {"db": loc.db, **loc.options}
    if loc.username:
        kwargs["username"] = loc.username
    if loc.password:
        kwargs["password"] = loc.password
    if loc.ssl:
        kwargs["ssl"] = True
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT,
        "socket_connect_timeout": SENTINEL_TIMEOUT,
    }
    if loc.sentinel_password:
        sentinel_kwargs["password"] = loc.sentinel_password
    return _master(list(loc.sentinels), loc.service, sentinel_kwargs, kwargs, asyncio)


def async_master_like(pool: Any, kwargs: dict[str, Any], ssl: bool = False) -> Any:
    """A ``redis.asyncio`` client of the master that the sync Sentinel ``pool`` (a
    django-redis ``SentinelClient``'s) follows, with its Sentinels and service.

    :param pool: a ``redis.sentinel.SentinelConnectionPool``.
    :param kwargs: the master connections' settings mirrored for asyncio.
    :param ssl: whether the master's connections use TLS.
    :returns: a ``redis.asyncio.Redis`` on a Sentinel pool.
    """
    manager = pool.sentinel_manager
    sentinels = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in manager.sentinels
    ]
    own = {k: v for k, v in kwargs.items() if k not in ("host", "port", "path")}
    if ssl:
        own["ssl"] = True
    sentinel_kwargs = {k: v for k, v in (manager.sentinel_kwargs or {}).items() if k in own}
    sentinel_kwargs.setdefault("socket_timeout", SENTINEL_TIMEOUT)
    return _master(sentinels, pool.service_name, sentinel_kwargs, own, True)


def is_sentinel_pool(pool: Any) -> bool:
    """Whether ``pool`` follows a master through its Sentinels.

    :param pool: a sync redis-py connection pool.
    :returns: True for a ``redis.sentinel.SentinelConnectionPool``.
    """
    return isinstance(pool, redis.sentinel.SentinelConnectionPool)


def close_sentinels(client: Any) -> None:
    """Close the connections to the Sentinels of a client :func:`master_client` built
    (the client's own pool is closed by ``client.close()``).

    :param client: a sync client on a Sentinel pool.
    """
    for sentinel in client.connection_pool.sentinel_manager.sentinels:
        sentinel.close()


def _master(
    sentinels: list[tuple[str, int]],
    service: str,
    sentinel_kwargs: dict[str, Any],
    kwargs: dict[str, Any],
    asyncio: bool,
) -> Any:
    module: Any = redis.asyncio.sentinel if asyncio else redis.sentinel
    manager = module.Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
    return manager.master_for(service, **kwargs)
