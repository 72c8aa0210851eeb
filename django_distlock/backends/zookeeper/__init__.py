"""The ZooKeeper lock backend: see :class:`~.backend.ZooKeeperBackend` and
``docs/zookeeper.md``."""

from .backend import ZooKeeperBackend

__all__ = ["ZooKeeperBackend"]
