"""A network namespace of the test's own, with a veth pair to the root namespace.

A process run with :meth:`Namespace.popen` sees only the namespace's side of the
pair (``client_ip``); it reaches the servers (on 127.0.0.1 of the root namespace)
through forwarders listening on the root side (``root_ip``, :mod:`tests.forwarder`).
:meth:`Namespace.partition` adds iptables ``DROP`` rules inside the namespace for
some of those ports, both ways: packets vanish (no reset, no ICMP), as in a real
partition; :meth:`Namespace.heal` takes them out. Names and addresses are unique
per run; :meth:`Namespace.close` (also run at exit) deletes the namespace, the
veth pair and, with them, the rules, whatever the test did.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import secrets
import shutil
import subprocess
from typing import Any

import pytest

__all__ = ["Namespace", "netns_missing", "require_netns"]


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if done.returncode:
        raise OSError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def netns_missing() -> str | None:
    """Why namespaces with iptables cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if not shutil.which(tool):
            return f"`{tool}` is not installed (scripts/servers.py install adds iptables)"
    return None


def require_netns() -> None:
    """Fail (full run: ``DISTLOCK_SERVERS=1``) or skip when namespaces are unavailable."""
    why = netns_missing()
    if why is None:
        return
    if os.environ.get("DISTLOCK_SERVERS") == "1":
        pytest.fail(f"DISTLOCK_SERVERS=1 but the partition tests cannot run: {why}.")
    pytest.skip(why)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of 10.213.0.0/16 that no interface of the root namespace uses."""
    used = _run("ip", "-o", "-4", "addr", "show")
    for _ in range(100):
        net = ipaddress.IPv4Network((0x0AD50000 + secrets.randbelow(1 << 14) * 4, 30))
        if f" {net[1]}/" not in used and f" {net[2]}/" not in used:
            return net
    raise OSError("No free /30 in 10.213.0.0/16.")


class Namespace:
    """A namespace ``distlock-<tag>`` linked to the root namespace by a veth pair."""

    def __init__(self) -> None:
        tag = secrets.token_hex(4)
        self.name, self.veth = f"distlock-{tag}", f"dlv{tag}"
        net = _free_subnet()
        self.root_ip, self.client_ip = str(net[1]), str(net[2])
        self.rules: list[list[str]] = []
        atexit.register(self.close)
        try:
            _run("ip", "netns", "add", self.name)
            _run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.veth + "n")
            _run("ip", "link", "set", self.veth + "n", "netns", self.name)
            _run("ip", "addr", "add", f"{self.root_ip}/30", "dev", self.veth)
            _run("ip", "link", "set", self.veth, "up")
            self.exec("ip", "addr", "add", f"{self.client_ip}/30", "dev", self.veth + "n")
            self.exec("ip", "link", "set", self.veth + "n", "up")
            self.exec("ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def exec(self, *argv: str) -> str:
        """Run a command in the namespace; its output.

        :raises OSError: when it fails.
        """
        return _run("ip", "netns", "exec", self.name, *argv)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start ``argv`` in the namespace (``subprocess.Popen`` keywords, text mode)."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], text=True, **kwargs)

    def partition(self, ports: list[int]) -> None:
        """Drop every packet between the namespace and these ports of the root side."""
        for port in ports:
            for rule in (["OUTPUT", "-d", self.root_ip, "-p", "tcp", "--dport", str(port)],
                         ["INPUT", "-s", self.root_ip, "-p", "tcp", "--sport", str(port)]):
                self.exec("iptables", "-w", "-A", *rule, "-j", "DROP")
                self.rules.append(rule)

    def heal(self) -> None:
        """Take out every rule :meth:`partition` added."""
        while self.rules:
            self.exec("iptables", "-w", "-D", *self.rules.pop(), "-j", "DROP")

    def close(self) -> None:
        """Delete the namespace and the veth pair (idempotent)."""
        self.rules = []
        for argv in (("ip", "netns", "del", self.name), ("ip", "link", "del", self.veth)):
            subprocess.run(argv, capture_output=True, timeout=20)
        atexit.unregister(self.close)
