"""Which Django caches can hold a lock safely, and why the others cannot (no I/O)."""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

#: The caches a lock can live on, and the driver of each (subclasses count too).
MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
REDIS = "django.core.cache.backends.redis.RedisCache"
SUPPORTED = {MEMCACHED: "memcached", REDIS: "redis"}

#: Why each known cache cannot hold a lock (checked in order: subclasses included).
REFUSED = {
    "django.core.cache.backends.locmem.LocMemCache": (
        "it is process-local: its add() excludes the threads of one process, not other "
        "processes or machines"
    ),
    "django.core.cache.backends.db.DatabaseCache": (
        "its add() reads the row and writes it in separate statements, so two processes "
        "can both add over an expired entry, and it has no compare-and-delete: a release "
        "could delete a lock another owner took after expiry"
    ),
    "django.core.cache.backends.filebased.FileBasedCache": (
        "its add() checks for the file and then writes it, not atomically across "
        "processes, and it has no compare-and-delete"
    ),
    "django.core.cache.backends.dummy.DummyCache": (
        "it stores nothing: every add() succeeds, so every caller would be granted"
    ),
    "django.core.cache.backends.memcached.PyLibMCCache": (
        "this package compares through pymemcache's meta commands; point a "
        f"{MEMCACHED} alias at the same servers"
    ),
    "django_redis.cache.RedisCache": (
        "use django_distlock.backends.redis.RedisBackend with OPTIONS['CACHE'] naming "
        "this cache: it reuses the cache's connections and adds fencing and fair queues"
    ),
}


def cache_kind(alias: object) -> tuple[str | None, str]:
    """Say whether a lock can live on the cache ``alias`` (reads settings only, no I/O).

    :param alias: a ``CACHES`` alias (anything else is refused with a reason).
    :returns: ``(kind, "")`` for a usable cache, ``kind`` being "memcached" or
        "redis"; ``(None, why)`` for one that cannot hold a lock safely.
    """
    caches = getattr(settings, "CACHES", {})
    if not isinstance(alias, str) or alias not in caches:
        return None, (
            f"OPTIONS['CACHE'] names {alias!r}, which is not a cache alias "
            f"(CACHES has {sorted(caches)})"
        )
    path = caches[alias].get("BACKEND", "")
    try:
        cls = import_string(path)
    except ImportError as exc:
        return None, f"CACHES[{alias!r}]['BACKEND'] {path!r} cannot be imported: {exc}"
    for known, kind in SUPPORTED.items():
        if _is_sub(cls, known):
            return kind, ""
    for known, why in REFUSED.items():
        if _is_sub(cls, known):
            return None, f"CACHES[{alias!r}] uses {path}, which cannot hold a lock: {why}"
    return None, (
        f"CACHES[{alias!r}] uses {path}, which this backend does not know: it cannot tell "
        "whether its add() is atomic across processes or whether it can compare an owner "
        f"before deleting (supported: {', '.join(SUPPORTED)})"
    )


def _is_sub(cls: object, path: str) -> bool:
    try:
        base = import_string(path)
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, base)
