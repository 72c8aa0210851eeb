"""How redis-py fails, and what each failure becomes (:data:`REDIS_ERRORS`, the backend's
``errors``).

The client boundary is :class:`.client.Redis` and :class:`.wire.KeptConnections` (every
command of the backend goes through them) and the few modules that use redis-py's
pipeline or pub/sub (:mod:`.batch`, :mod:`.hub`, :mod:`.replication`): they catch
:data:`CLIENT_ERRORS` and raise ``REDIS_ERRORS.translate(exc) from exc``; the rest of the
backend sees :class:`~django_distlock.exceptions.BackendUnavailable` only.
"""

from __future__ import annotations

from redis.exceptions import RedisClusterException, RedisError

from ...exceptions import BackendUnavailable, DistLockError, LockConfigurationError
from ..base import ErrorMap

#: What redis-py raises when Redis fails: a cluster client's RedisClusterException
#: (no startup node reachable, a slot not covered) is not a RedisError.
CLIENT_ERRORS = (RedisError, RedisClusterException)


class RedisErrors(ErrorMap):
    """Every redis-py error is :class:`BackendUnavailable`, naming the error's class.

    ``where`` is not used (one message for every alias: the error names the server).
    """

    def translate(
        self, exc: BaseException, doing: str = "", where: str = ""
    ) -> DistLockError | LockConfigurationError:
        during = f" while {doing}" if doing else ""
        return BackendUnavailable(f"Redis failed{during}: {type(exc).__name__}: {exc}")


#: The Redis backends' error map (``RedisBackend.errors``, ``RedlockBackend.errors``).
REDIS_ERRORS = RedisErrors(CLIENT_ERRORS)


def did_not_answer(timeout: float | None, what: str = "") -> BackendUnavailable:
    """The error for a call that Redis did not answer within ``timeout`` seconds (an
    ``asyncio.timeout`` or a read bound: a frozen or unreachable server), raised ``from``
    the ``TimeoutError``.

    :param what: the command, when it is not a lock call (``"INFO"``).
    """
    command = f" {what}" if what else ""
    return BackendUnavailable(
        f"Redis did not answer{command} within {timeout or 0:.3g} s (frozen or unreachable?)"
    )
