"""How kazoo fails, and what each failure becomes (:data:`ZOOKEEPER_ERRORS`, the backend's
``errors``).

The client boundary is :class:`.client.Client`: its ``call()``, ``call_async()`` and
``wait()`` catch :data:`ERRORS` and raise ``ZOOKEEPER_ERRORS.translate(exc, doing) from
exc``, so the rest of the backend sees
:class:`~django_distlock.exceptions.BackendUnavailable`, chained to kazoo's error: a read
cut by ``ConnectionLoss`` or ``SessionExpiredError`` is retried by looking at
``exc.__cause__``. The node errors a caller handles (``NoNodeError``...) pass through.
The watches sent from kazoo's callback thread catch :data:`ERRORS` and go on without
the watch (best effort).
"""

from __future__ import annotations

from kazoo.exceptions import ConnectionLoss, KazooException, NoAuthError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from ...exceptions import BackendUnavailable, DistLockError, LockConfigurationError
from ..base import ErrorMap

#: What a kazoo call may raise that means "the server failed or is unreachable".
ERRORS: tuple[type[BaseException], ...] = (KazooException, KazooTimeoutError)


class ZooKeeperErrors(ErrorMap):
    """Every kazoo error is :class:`BackendUnavailable`, saying what it means (a timeout:
    no server or no quorum; ``NoAuthError``: the ACL; an expired session; a lost
    connection). ``where`` is not used (the hosts are in ``doing`` where they help)."""

    def translate(
        self, exc: BaseException, doing: str = "", where: str = ""
    ) -> DistLockError | LockConfigurationError:
        if isinstance(exc, KazooTimeoutError):
            why = "ZooKeeper did not answer in time (no server reachable, or no quorum)"
        elif isinstance(exc, NoAuthError):
            why = "ZooKeeper refused access (the node's ACL does not grant OPTIONS['AUTH'] it)"
        elif isinstance(exc, SessionExpiredError):
            why = "the ZooKeeper session expired"
        elif isinstance(exc, ConnectionLoss):
            why = "the connection to ZooKeeper was lost"
        else:
            why = f"ZooKeeper failed: {type(exc).__name__}: {exc}"
        return BackendUnavailable(f"{why}{' while ' + doing if doing else ''}.")


#: The ZooKeeper backend's error map (``ZooKeeperBackend.errors``).
ZOOKEEPER_ERRORS = ZooKeeperErrors(ERRORS)
