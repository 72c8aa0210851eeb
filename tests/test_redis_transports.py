"""The Redis backend over TLS (``rediss://``, a certificate made for the test, and a
password) and on a Unix socket (``unix://``), each against a private redis-server: a
URL alias and a django-redis cache alias, threads woken by a release, asyncio tasks
(the cache's connection settings mirrored in redis.asyncio)."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.core.cache import caches
from django.test import override_settings

from django_distlock.backends.redis import RedisBackend

from .conftest import eventually, require_redis
from .private_redis import _free_port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _serving(proc: subprocess.Popen[bytes], url: str) -> Iterator[str]:
    """Yield ``url`` once the server ``proc`` answers on it; kill it afterwards."""
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        assert eventually(lambda: _answers(client), timeout=10), f"no Redis at {url}"
        yield url
    finally:
        client.close()
        proc.kill()
        proc.wait(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def tls_url(tmp_path: Path) -> Iterator[str]:
    require_redis()  # the same Debian redis-server, built with TLS
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "1", "-subj", "/CN=distlock-test-ca", cwd=tmp_path)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=127.0.0.1", cwd=tmp_path)
    (tmp_path / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.cnf",
             cwd=tmp_path)
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no",
         "--requirepass", "s3cret",  # and a password, which the async mirror must carry
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = (f"rediss://:s3cret@127.0.0.1:{port}/0?ssl_cert_reqs=required"
           f"&ssl_ca_certs={tmp_path / 'ca.crt'}")
    yield from _serving(proc, url)


def _exercise(backend: RedisBackend) -> None:
    """Acquire, a thread woken by the release, and tasks waiting on one another."""
    holder = backend.lock("tls", ttl=10)
    assert holder.acquire()
    waiter = backend.lock("tls", ttl=10)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=10)))
    thread.start()
    assert eventually(lambda: backend.held_locks().locks[0].waiters == 1)
    holder.release()
    thread.join(10)
    assert got == [True]
    waiter.release()

    async def tasks() -> int:
        held = 0

        async def one() -> None:
            nonlocal held
            async with backend.lock("tls-task", ttl=10, timeout=10):
                held += 1
                await asyncio.sleep(0.01)

        await asyncio.gather(*(one() for _ in range(5)))
        return held

    assert asyncio.run(tasks()) == 5
    assert not backend.is_locked("tls") and not backend.is_locked("tls-task")


def test_a_rediss_url(tls_url: str) -> None:
    backend = RedisBackend("tls", {"LOCATION": tls_url})
    try:
        _exercise(backend)
    finally:
        backend.close()


def test_a_django_redis_cache_over_tls(tls_url: str) -> None:
    cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": tls_url}
    with override_settings(CACHES={"default": cache, "tls": cache}):
        backend = RedisBackend("tls-cache", {"OPTIONS": {"CACHE": "tls"}})
        try:
            _exercise(backend)
        finally:
            backend.close()
            caches["tls"].close()


@pytest.fixture
def unix_url(tmp_path: Path) -> Iterator[str]:
    require_redis()
    path = tmp_path / "redis.sock"
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    yield from _serving(proc, f"unix://{path}?db=0")


def test_a_unix_socket_url(unix_url: str) -> None:
    backend = RedisBackend("unix", {"LOCATION": unix_url})
    try:
        _exercise(backend)
    finally:
        backend.close()


def test_a_django_redis_cache_on_a_unix_socket(unix_url: str) -> None:
    cache = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": unix_url}
    with override_settings(CACHES={"default": cache, "unix": cache}):
        backend = RedisBackend("unix-cache", {"OPTIONS": {"CACHE": "unix"}})
        try:
            _exercise(backend)
        finally:
            backend.close()
            caches["unix"].close()
