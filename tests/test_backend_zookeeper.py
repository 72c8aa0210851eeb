"""The ZooKeeper backend against the 3-node ensemble that scripts/test starts: the
shipped contract (plain and with digest auth), round trips, watches, names, listing,
fencing across a re-created parent, orphans, session states, options and checks."""

from __future__ import annotations

import os

import pytest

from django_distlock.testing import LockContract

from .conftest import require_zookeeper

HOSTS = os.environ.get("DISTLOCK_ZK_HOSTS", "")


class ZooKeeperContract(LockContract):
    @pytest.fixture(autouse=True)
    def _zookeeper(self) -> None:
        require_zookeeper()


class TestZooKeeper(ZooKeeperContract):
    alias = "zk"


class TestZooKeeperAuth(ZooKeeperContract):
    alias = "zk-auth"
