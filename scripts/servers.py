#!/usr/bin/env python3
"""Start and stop the real servers the django-distlock tests and benchmarks use.

Everything runs on 127.0.0.1, on ports the OS reports free, with all data,
logs and sockets inside one directory given with --dir:

    scripts/servers.py install                 # apt-get the servers if missing
    scripts/servers.py start --dir DIR [--only redis,zookeeper,postgres,mariadb,memcached]
    scripts/servers.py stop --dir DIR          # idempotent; does not delete DIR

Kind zookeeper-standalone (only when named: the benchmarks compare the two) starts
one ZooKeeper of its own (DISTLOCK_ZK_STANDALONE).

Kind redis starts one server (DISTLOCK_REDIS_URL), 5 more for Redlock
(DISTLOCK_REDLOCK_URLS) and a Redis Cluster of 3 masters without replicas
(DISTLOCK_REDIS_CLUSTER_URL, one seed node; DISTLOCK_REDIS_CLUSTER_NODES, all).

Kind sentinel starts a master with 2 replicas and 3 Sentinels watching it as the
service `distlock` (DISTLOCK_SENTINEL_URL, a redis+sentinel:// URL;
DISTLOCK_SENTINELS, the Sentinels' host:port list). Tests that fail it over
start a set of their own (tests/private_sentinel.py).

`start` writes DIR/env (shell `export` lines, also printed on stdout) and
DIR/state.json (pids, ports). `stop` ends only the pids recorded there.
Kind mariadb starts MariaDB (Debian 12's 10.11) as user mysql, with a user `distlock`
(no password, from 127.0.0.1, every privilege: the tests create their database, KILL and
SET GLOBAL) and a database `distlock`; root logs in through DISTLOCK_MYSQL_SOCKET. It runs
without the log's flush at each commit (kept across a SIGKILL of the server all the same)
unless DISTLOCK_MYSQL_DURABLE=1 (the benchmarks).

Standard library only (Python 3.11), so it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

KINDS = ("redis", "sentinel", "zookeeper", "postgres", "mariadb", "memcached")
#: Started only when named in --only (scripts/bench): a standalone ZooKeeper.
EXTRA_KINDS = ("zookeeper-standalone",)
REDLOCK_COUNT = 5  # independent Redis servers for the Redlock backend
CLUSTER_NODES = 3  # masters of the Redis Cluster (no replicas)
ZK_NODES = 3
SENTINEL_REPLICAS = 2  # replicas of the Sentinel-watched master
SENTINELS = 3
SENTINEL_SERVICE = "distlock"

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# DISTLOCK_TEST_ZK_JAR: only to test the failure path (a bad jar makes ZooKeeper fail).
ZK_JAR = os.environ.get("DISTLOCK_TEST_ZK_JAR", "/usr/share/java/zookeeper.jar")
ZK_CLASSPATH = [ZK_JAR, "/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"]
APT_PACKAGES = [
    "redis-server",
    "redis-sentinel",
    "zookeeper",
    "postgresql",
    "mariadb-server",
    "default-libmysqlclient-dev",  # with pkg-config: the mysqlclient driver builds on them
    "pkg-config",
    "memcached",
    "chromium",  # with chromium-driver: the admin's browser tests (test_optimistic_browser.py)
    "chromium-driver",
    "iproute2",  # with iptables: the partition tests (tests/test_partitions.py), namespaces
    "iptables",
    "gdb",  # pauses a server's process at an exact point (tests/debugger.py)
]

READY_TIMEOUT = {
    "redis": 30.0,
    "sentinel": 30.0,
    "zookeeper": 60.0,
    "zookeeper-standalone": 60.0,
    "postgres": 30.0,
    "mariadb": 30.0,
    "memcached": 30.0,
}
STOP_TIMEOUT = 10.0

# Every process launched by this run, recorded as soon as it exists, so that a failure
# or an interrupt at any point can stop exactly these (state.json holds the same list).
LAUNCHED: list[dict] = []


class StartError(Exception):
    """A server did not start: its name, why, and the log to show."""

    def __init__(self, name: str, reason: str, log: Path | None = None) -> None:
        super().__init__(f"{name}: {reason}")
        self.name, self.reason, self.log = name, reason, log


def interrupted(signum, frame):
    """SIGTERM handler during start: unwind like ^C, so what was launched gets stopped."""
    raise KeyboardInterrupt


# --------------------------------------------------------------------------- helpers


def free_ports(count: int) -> list[int]:
    """Ask the OS for `count` distinct free TCP ports on 127.0.0.1."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)  # all stay open until the end, so the ports are distinct
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ask(port: int, payload: bytes, timeout: float = 1.0) -> bytes:
    """Send `payload` to 127.0.0.1:port; return the reply (up to EOF or a first full line)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        reply = b""
        with contextlib.suppress(TimeoutError):
            while data := s.recv(4096):
                reply += data
                if payload != b"srvr" and reply.endswith(b"\r\n"):
                    break  # Redis and memcached keep the connection open; ZooKeeper closes it
        return reply


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int | None, starttime: str | None = None) -> bool:
    """True if PID runs and is not a zombie (and, if given, started at `starttime`)."""
    stat = proc_stat(pid) if pid else None
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return starttime is None or stat[19] == starttime  # same start time: not a reused pid


def tail(path: Path | None, lines: int = 30) -> str:
    """Return the last `lines` lines of a log file (or a note that there is none)."""
    if path is None or not path.exists():
        return "(no log file)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(log is empty)"


def spawn(name: str, kind: str, port: int, argv: list[str], wd: Path, log: Path) -> dict:
    """Start a server in the foreground, detached in its own session; return its state entry."""
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=wd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # ^C in the caller's terminal does not reach it
            )
        except OSError as exc:
            raise StartError(name, f"cannot run {argv[0]}: {exc}", log) from exc
    stat = proc_stat(proc.pid)
    entry = {"name": name, "kind": kind, "port": port, "pid": proc.pid, "log": str(log)}
    entry["starttime"] = stat[19] if stat else None
    LAUNCHED.append(entry)
    return entry


def wait_until(
    name: str, check, entry: dict | None, timeout: float, log: Path | None, status=None
) -> None:
    """Poll `check()` until it is true; raise StartError at the deadline or if the process dies.

    `status()`, if given, says what the last check saw, for the error at the deadline.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            if check():
                return
            if status is not None:
                last = status()
        except OSError as exc:
            last = str(exc)
        if entry is not None and not alive(entry["pid"]):
            raise StartError(name, "process exited during startup", log)
        time.sleep(0.05)
    raise StartError(name, f"not ready after {timeout:.0f} s ({last})", log)


def su_postgres(cmd: str, log: Path | None = None) -> int:
    """Run a shell command as the postgres user (initdb and pg_ctl refuse root)."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            ["su", "postgres", "-s", "/bin/sh", "-c", cmd],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.wait()  # su got the signal too: let it end, so postmaster.pid is settled
            raise
    finally:
        if log:
            out.close()


# --------------------------------------------------------------------------- servers


def launch_redis(dir_: Path, name: str, port: int, *extra: str) -> dict:
    """Launch one Redis server without persistence (``extra``: more arguments); see wait_redis."""
    wd = dir_ / name
    wd.mkdir()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(wd), "--logfile", "", *extra]  # log to stdout
    return spawn(name, "redis", port, argv, wd, wd / "redis.log")


def wait_redis(entries: list[dict]) -> None:
    """Wait until every launched Redis server answers PING."""
    for e in entries:
        ping = lambda port=e["port"]: ask(port, b"PING\r\n").startswith(b"+PONG")  # noqa: E731
        wait_until(e["name"], ping, e, READY_TIMEOUT["redis"], Path(e["log"]))


def redis_bulk(port: int, command: bytes, timeout: float = 1.0) -> bytes:
    """Send one inline command to the Redis server on 127.0.0.1:port; return its bulk reply.

    :raises OSError: on no answer, a closed connection, or a reply that is not a bulk string.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(command)
        reply = b""
        while b"\r\n" not in reply:
            if not (data := s.recv(4096)):
                raise OSError("connection closed")
            reply += data
        header, _, body = reply.partition(b"\r\n")
        if not header.startswith(b"$"):
            raise OSError(f"unexpected reply {header.decode(errors='replace')}")
        size = int(header[1:])
        while len(body) < size + 2:
            if not (data := s.recv(4096)):
                raise OSError("connection closed")
            body += data
        return body[:size]


def launch_redis_cluster(dir_: Path, ports: list[int]) -> list[dict]:
    """Launch CLUSTER_NODES cluster-enabled Redis servers (client and bus port each from
    `ports`), to be joined by join_redis_cluster.

    Launched first because a master refuses to turn cluster_state:ok until 2 s after
    it started (Redis' CLUSTER_WRITABLE_DELAY): the other servers start meanwhile.
    """
    entries = []
    for i in range(CLUSTER_NODES):
        name, port, bus = f"cluster{i + 1}", ports[2 * i], ports[2 * i + 1]
        conf = dir_ / name / "nodes.conf"
        extra = ["--cluster-enabled", "yes", "--cluster-config-file", str(conf)]
        extra += ["--cluster-port", str(bus), "--cluster-node-timeout", "2000"]
        entries.append(launch_redis(dir_, name, port, *extra))
    return entries


def join_redis_cluster(dir_: Path, entries: list[dict]) -> None:
    """Wait for the cluster nodes to answer, then give them the slots (no replicas) with
    `redis-cli --cluster create`; wait_redis_cluster waits for the result."""
    wait_redis(entries)
    log = dir_ / "cluster1" / "create.log"
    argv = ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{e['port']}" for e in entries)]
    argv += ["--cluster-replicas", "0", "--cluster-yes"]
    with open(log, "ab") as out:
        try:
            created = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=READY_TIMEOUT["redis"],
                check=False,
            )
        except OSError as exc:
            raise StartError("cluster", f"cannot run redis-cli: {exc}", log) from exc
        except subprocess.TimeoutExpired:  # run() has killed it
            raise StartError(
                "cluster",
                f"redis-cli --cluster create took over {READY_TIMEOUT['redis']:.0f} s",
                log,
            ) from None
    if created.returncode != 0:
        raise StartError(
            "cluster", f"redis-cli --cluster create exited with status {created.returncode}", log
        )


def cluster_info(port: int) -> dict[str, str]:
    """CLUSTER INFO of the node on 127.0.0.1:port, as field -> value."""
    text = redis_bulk(port, b"CLUSTER INFO\r\n").decode(errors="replace")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def wait_redis_cluster(entries: list[dict]) -> None:
    """Wait until every node says cluster_state:ok with all 16384 slots assigned."""
    seen = ""

    def joined() -> bool:
        nonlocal seen
        for e in entries:
            if not alive(e["pid"]):  # fail fast, naming the node
                raise StartError(e["name"], "process exited during startup", Path(e["log"]))
        for e in entries:
            info = cluster_info(e["port"])
            state, slots = info.get("cluster_state"), info.get("cluster_slots_assigned")
            if state != "ok" or slots != "16384":
                seen = f"{e['name']} says cluster_state:{state}, {slots} of 16384 slots assigned"
                return False
        return True

    log = Path(entries[0]["log"])
    wait_until("cluster", joined, None, READY_TIMEOUT["redis"], log, status=lambda: seen)


def launch_sentinel_set(dir_: Path, ports: list[int]) -> tuple[list[dict], list[int]]:
    """Launch a master and SENTINEL_REPLICAS replicas of it (``ports``: theirs, then the
    Sentinels'); wait_sentinel_set starts the Sentinels once the replicas are in sync."""
    # the replicas' first sync at once (Redis 7 waits 5 s for more replicas by default)
    master = launch_redis(dir_, "sentinel-master", ports[0], "--repl-diskless-sync-delay", "0")
    replicas = [
        launch_redis(dir_, f"sentinel-replica{i + 1}", ports[1 + i],
                     "--replicaof", "127.0.0.1", str(ports[0]))
        for i in range(SENTINEL_REPLICAS)
    ]
    return [master, *replicas], ports[1 + SENTINEL_REPLICAS:]


def sentinel_argv(conf: Path) -> list[str]:
    """How to run a Sentinel on ``conf`` (redis-sentinel is redis-server in Sentinel mode)."""
    if shutil.which("redis-sentinel"):
        return ["redis-sentinel", str(conf)]
    return ["redis-server", str(conf), "--sentinel"]


def wait_sentinel_set(dir_: Path, servers: list[dict], ports: list[int]) -> list[dict]:
    """Wait until the replicas are in sync, start the Sentinels, and wait until each
    names the master of SENTINEL_SERVICE and knows both replicas."""
    wait_redis(servers)
    for e in servers[1:]:
        synced = lambda port=e["port"]: b"master_link_status:up" in redis_bulk(  # noqa: E731
            port, b"INFO replication\r\n"
        )
        wait_until(e["name"], synced, e, READY_TIMEOUT["sentinel"], Path(e["log"]))
    master = servers[0]["port"]
    sentinels = []
    for i, port in enumerate(ports):
        wd = dir_ / f"sentinel{i + 1}"
        wd.mkdir()
        conf = wd / "sentinel.conf"  # Sentinel rewrites it: in its own directory
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {wd}\nlogfile \"\"\n"
            f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master} 2\n"
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 2000\n"
            f"sentinel failover-timeout {SENTINEL_SERVICE} 10000\n"
        )
        sentinels.append(spawn(f"sentinel{i + 1}", "sentinel", port, sentinel_argv(conf), wd,
                               wd / "sentinel.log"))
    for e in sentinels:
        def ready(port: int = e["port"]) -> bool:
            reply = ask(port, f"SENTINEL master {SENTINEL_SERVICE}\r\n".encode())
            return f"${len(str(master))}\r\n{master}\r\n".encode() in reply and (
                b"num-slaves\r\n$1\r\n%d\r\n" % SENTINEL_REPLICAS in reply
            )
        wait_until(e["name"], ready, e, READY_TIMEOUT["sentinel"], Path(e["log"]))
    return sentinels


def start_memcached(dir_: Path, port: int) -> dict:
    """Start memcached in the foreground as user nobody; ready when `version` answers."""
    wd = dir_ / "memcached"
    wd.mkdir()
    log = wd / "memcached.log"
    argv = ["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-u", "nobody", "-m", "64"]
    entry = spawn("memcached", "memcached", port, argv, wd, log)
    version = lambda: ask(port, b"version\r\n").startswith(b"VERSION")  # noqa: E731
    wait_until("memcached", version, entry, READY_TIMEOUT["memcached"], log)
    return entry


def launch_zookeeper(dir_: Path, ports: list[int]) -> list[dict]:
    """Launch a 3-node ensemble by running the JVM directly (zkServer.sh ignores env overrides)."""
    client, quorum, election = ports[0:3], ports[3:6], ports[6:9]
    members = "".join(
        f"server.{i + 1}=127.0.0.1:{quorum[i]}:{election[i]}\n" for i in range(ZK_NODES)
    )
    entries: list[dict] = []
    for i in range(ZK_NODES):
        wd = dir_ / f"zookeeper{i + 1}"
        wd.mkdir()
        (wd / "myid").write_text(f"{i + 1}\n")
        entry = launch_zookeeper_node(
            f"zookeeper{i + 1}", "zookeeper", wd, client[i], members,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        )
        entry.update(quorum_port=quorum[i], election_port=election[i])
        entries.append(entry)
    return entries


def launch_zookeeper_standalone(dir_: Path, port: int) -> dict:
    """Launch one ZooKeeper on its own (no quorum: each write is one server's)."""
    wd = dir_ / "zookeeper-standalone"
    wd.mkdir()
    return launch_zookeeper_node(
        "zookeeper-standalone", "zookeeper-standalone", wd, port, "",
        "org.apache.zookeeper.server.ZooKeeperServerMain",
    )


def launch_zookeeper_node(
    name: str, kind: str, wd: Path, port: int, members: str, main_class: str
) -> dict:
    """Write ``wd/zoo.cfg`` (``members``: the ensemble's server lines, or none) and
    start the JVM running ``main_class`` on it."""
    (wd / "zoo.cfg").write_text(
        f"tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={wd}\n"
        f"clientPort={port}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\n"
        "admin.enableServer=false\n4lw.commands.whitelist=ruok,stat,srvr,mntr,conf,isro\n"
        + members
    )
    (wd / "log4j.properties").write_text(  # without it log4j 1.2 logs nothing at all
        "log4j.rootLogger=INFO, CONSOLE\n"
        "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1} - %m%n\n"
    )
    argv = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    argv += [f"-Dlog4j.configuration=file:{wd / 'log4j.properties'}"]
    argv += ["-cp", ":".join(ZK_CLASSPATH), main_class]
    # ZooKeeperServerMain takes the config file too
    argv += [str(wd / "zoo.cfg")]
    return spawn(name, kind, port, argv, wd, wd / "zk.log")


def wait_zookeeper(entries: list[dict]) -> None:
    """Wait until every node answers `srvr` with a `Mode:` line and exactly one is leader."""

    def check() -> bool:
        modes = []
        for e in entries:
            if not alive(e["pid"]):  # fail fast, naming the node, if a JVM died
                raise StartError(e["name"], "process exited during startup", Path(e["log"]))
            reply = ask(e["port"], b"srvr").decode(errors="replace")
            mode = [ln.split(":", 1)[1].strip() for ln in reply.splitlines() if ln[:5] == "Mode:"]
            if not mode:
                return False
            modes.append(mode[0])
        return modes.count("leader") == 1

    wait_until("zookeeper", check, None, READY_TIMEOUT["zookeeper"], Path(entries[0]["log"]))


def wait_zookeeper_standalone(entry: dict) -> None:
    """Wait until the standalone server answers `srvr` with `Mode: standalone`."""
    standalone = lambda: b"Mode: standalone" in ask(entry["port"], b"srvr")  # noqa: E731
    wait_until(
        "zookeeper-standalone", standalone, entry, READY_TIMEOUT["zookeeper"], Path(entry["log"])
    )


def start_postgres(dir_: Path, port: int) -> dict:
    """initdb (trust auth) and start PostgreSQL 15 as the postgres user; create db `distlock`."""
    wd = dir_ / "postgres"
    data, sock = wd / "data", wd / "run"
    for d in (wd, sock):
        d.mkdir()
        shutil.chown(d, "postgres", "postgres")
    os.chmod(dir_, os.stat(dir_).st_mode | 0o011)  # mktemp -d makes 0700: let postgres in
    log, server_log = wd / "setup.log", wd / "postgres.log"
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    if su_postgres(f"test -w {q(wd)}") != 0:
        raise StartError("postgres", f"user postgres cannot write {wd} (parent not traversable?)")
    entry = {"name": "postgres", "kind": "postgres", "port": port, "pid": None}
    entry.update(starttime=None, data=str(data), log=str(server_log))
    LAUNCHED.append(entry)  # before pg_ctl: a failed or interrupted start is stopped too
    steps = [
        f"{q(PG_BIN / 'initdb')} -D {q(data)} -U postgres --auth-host=trust --auth-local=trust"
        " -E UTF8 --no-instructions",
        f"{q(PG_BIN / 'pg_ctl')} -D {q(data)} -l {q(server_log)} -w -t 30 start",
        f"{q(PG_BIN / 'createdb')} -h 127.0.0.1 -p {port} -U postgres -O postgres distlock",
    ]
    for i, cmd in enumerate(steps):
        if i == 1:  # between initdb and start: loopback only, socket in our dir
            # Tests skip fsync for speed; benchmarks (DISTLOCK_PG_DURABLE=1) keep
            # PostgreSQL's durable defaults, as a production server would.
            durable = os.environ.get("DISTLOCK_PG_DURABLE") == "1"
            with open(data / "postgresql.conf", "a") as conf:
                conf.write(
                    f"\nlisten_addresses = '127.0.0.1'\nport = {port}\n"
                    f"unix_socket_directories = '{sock}'\nmax_connections = 200\n"
                )
                if not durable:
                    conf.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
        rc = su_postgres(cmd, log)
        if i == 1 and (pid := postmaster_pid(data)):
            entry.update(pid=pid, starttime=(proc_stat(pid) or [None] * 20)[19])
        if rc != 0:
            where = server_log if i >= 1 and server_log.exists() else log
            raise StartError("postgres", f"`{cmd}` exited with status {rc}", where)
    return entry


def start_mariadb(dir_: Path, port: int) -> dict:
    """mariadb-install-db and start mariadbd (it drops to user mysql itself); create the
    user and database `distlock`."""
    wd = dir_ / "mariadb"
    data, run = wd / "data", wd / "run"
    for d in (wd, data, run):
        d.mkdir()
        shutil.chown(d, "mysql", "mysql")
    os.chmod(dir_, os.stat(dir_).st_mode | 0o011)  # mktemp -d makes 0700: let mysql in
    log, server_log = wd / "setup.log", run / "mysqld.err"
    step = [
        "mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={data}",
        "--auth-root-authentication-method=socket", "--skip-test-db",
    ]
    with open(log, "ab") as out:
        rc = subprocess.call(step, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise StartError("mariadb", f"mariadb-install-db exited with status {rc}", log)
    durable = os.environ.get("DISTLOCK_MYSQL_DURABLE") == "1"
    argv = [
        "mariadbd", "--no-defaults", "--user=mysql", f"--datadir={data}", f"--port={port}",
        "--bind-address=127.0.0.1", f"--socket={run / 'mysqld.sock'}",
        f"--pid-file={run / 'mysqld.pid'}", f"--log-error={server_log}",
        "--skip-name-resolve", "--skip-log-bin", "--character-set-server=utf8mb4",
        "--max-connections=500", "--innodb-buffer-pool-size=128M",
        # As docs/database.md advises for session mode: a vanished client's connection,
        # and its named locks, end after about 8 s of silence.
        "--tcp-keepalive-time=5", "--tcp-keepalive-interval=1", "--tcp-keepalive-probes=3",
    ]
    if not durable:  # tests: no flush per commit (a SIGKILL of the server keeps commits)
        argv += ["--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0"]
    entry = spawn("mariadb", "mariadb", port, argv, wd, server_log)
    entry.update(data=str(data), argv=argv)

    def greets() -> bool:  # the first packet: 4 bytes of header, then the handshake's
        # protocol 10, or an error (0xff: no account for 127.0.0.1 yet, but it serves)
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            head = s.recv(5)
        return len(head) == 5 and head[4] in (10, 0xFF)

    wait_until("mariadb", greets, entry, READY_TIMEOUT["mariadb"], server_log)
    setup = (
        "CREATE USER 'distlock'@'127.0.0.1'; "
        "GRANT ALL ON *.* TO 'distlock'@'127.0.0.1' WITH GRANT OPTION; "
        "CREATE DATABASE distlock CHARACTER SET utf8mb4"
    )
    with open(log, "ab") as out:
        rc = subprocess.call(
            ["mariadb", "--no-defaults", "-uroot", f"--socket={run / 'mysqld.sock'}", "-e", setup],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    if rc != 0:
        raise StartError("mariadb", f"creating user and database exited with status {rc}", log)
    return entry


def postmaster_pid(data: Path) -> int | None:
    """The pid in DATA/postmaster.pid, or None if there is none (yet)."""
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------- stop


def stop_entries(entries: list[dict]) -> list[str]:
    """Stop servers (SIGTERM; pg_ctl -m fast for postgres), SIGKILL those left after a deadline."""
    for e in entries:
        if e["kind"] == "postgres" and not e.get("pid"):  # start failed or was interrupted
            # a postmaster forked just before pg_ctl died writes its pid file within moments
            data, until = Path(e["data"]), time.monotonic() + 1.0
            while (data / "PG_VERSION").exists() and time.monotonic() < until:
                e["pid"] = postmaster_pid(data)
                if e["pid"]:
                    break
                time.sleep(0.05)
        if not alive(e.get("pid"), e.get("starttime")):
            continue
        if e["kind"] == "postgres":  # -W: don't wait here; we wait on the pid with the others
            su_postgres(f"{PG_BIN / 'pg_ctl'} -D {shlex.quote(e['data'])} -m fast -W stop")
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(e["pid"], signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    pending = entries
    while True:
        pending = [e for e in pending if alive(e.get("pid"), e.get("starttime"))]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for e in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(e["pid"], signal.SIGKILL)
    return [e["name"] for e in pending]


def cmd_stop(dir_: Path) -> int:
    """Stop everything recorded in DIR/state.json and mark it stopped (a second call is a no-op)."""
    state_file = dir_ / "state.json"
    if not state_file.exists():
        print(f"servers.py: nothing to stop ({state_file} does not exist)", file=sys.stderr)
        return 0
    state = json.loads(state_file.read_text())
    entries = [e for e in state["servers"] if not e.get("stopped")]
    killed = stop_entries(entries)
    for e in entries:
        e["stopped"] = True
    state_file.write_text(json.dumps(state, indent=2) + "\n")
    if killed:
        print(
            f"servers.py: SIGKILL after {STOP_TIMEOUT:.0f} s: {', '.join(killed)}", file=sys.stderr
        )
    return 0


# --------------------------------------------------------------------------- start


def cmd_start(dir_: Path, kinds: list[str]) -> int:
    """Start the servers into DIR, write DIR/env and DIR/state.json, print the env lines."""
    dir_.mkdir(parents=True, exist_ok=True)
    state_file = dir_ / "state.json"
    if state_file.exists():
        old = json.loads(state_file.read_text())["servers"]
        if any(not e.get("stopped") and alive(e.get("pid"), e.get("starttime")) for e in old):
            print(f"servers.py: {state_file} lists running servers: stop first", file=sys.stderr)
            return 2
        for sub in dir_.iterdir():  # leftovers of an earlier, stopped run
            if sub.is_dir():
                shutil.rmtree(sub)
    t0 = time.monotonic()
    env = {"DISTLOCK_SERVERS": "1"}
    ports = iter(free_ports(
        1 + REDLOCK_COUNT + 2 * CLUSTER_NODES + 3 * ZK_NODES + 4 + 1 + SENTINEL_REPLICAS + SENTINELS
    ))

    def save() -> None:
        state = {"dir": str(dir_), "servers": LAUNCHED}
        state_file.write_text(json.dumps(state, indent=2) + "\n")

    signal.signal(signal.SIGTERM, interrupted)
    try:
        if "zookeeper" in kinds:  # the JVMs boot in the background while the others come up
            zk = launch_zookeeper(dir_, [next(ports) for _ in range(3 * ZK_NODES)])
            save()
        if "zookeeper-standalone" in kinds:
            zk1 = launch_zookeeper_standalone(dir_, next(ports))
            save()
        if "redis" in kinds:
            cluster = launch_redis_cluster(dir_, [next(ports) for _ in range(2 * CLUSTER_NODES)])
            redis = launch_redis(dir_, "redis", next(ports))
            redlock = [
                launch_redis(dir_, f"redlock{i + 1}", next(ports)) for i in range(REDLOCK_COUNT)
            ]
            save()
            wait_redis([redis, *redlock])
            env["DISTLOCK_REDIS_URL"] = f"redis://127.0.0.1:{redis['port']}/0"
            env["DISTLOCK_REDLOCK_URLS"] = ",".join(
                f"redis://127.0.0.1:{e['port']}/0" for e in redlock
            )
            join_redis_cluster(dir_, cluster)
        if "sentinel" in kinds:
            watched, sentinel_ports = launch_sentinel_set(
                dir_, [next(ports) for _ in range(1 + SENTINEL_REPLICAS + SENTINELS)]
            )
            save()
            sentinels = wait_sentinel_set(dir_, watched, sentinel_ports)
            save()
            where = ",".join(f"127.0.0.1:{e['port']}" for e in sentinels)
            env["DISTLOCK_SENTINEL_URL"] = f"redis+sentinel://{where}/{SENTINEL_SERVICE}/0"
            env["DISTLOCK_SENTINELS"] = where
            # the master as started (the shared set is never failed over): the benchmarks'
            # plain lock on the same server
            env["DISTLOCK_SENTINEL_MASTER_URL"] = f"redis://127.0.0.1:{watched[0]['port']}/0"
        if "postgres" in kinds:
            pg = start_postgres(dir_, next(ports))
            env["DISTLOCK_PG_HOST"] = "127.0.0.1"
            env["DISTLOCK_PG_PORT"] = str(pg["port"])
            env["DISTLOCK_PG_USER"] = "postgres"
            env["DISTLOCK_PG_NAME"] = "distlock"
            env["DISTLOCK_PG_LOG"] = str(dir_ / "postgres" / "postgres.log")
            save()
        if "mariadb" in kinds:
            my = start_mariadb(dir_, next(ports))
            save()
            run = dir_ / "mariadb" / "run"
            env["DISTLOCK_MYSQL_HOST"] = "127.0.0.1"
            env["DISTLOCK_MYSQL_PORT"] = str(my["port"])
            env["DISTLOCK_MYSQL_USER"] = "distlock"
            env["DISTLOCK_MYSQL_NAME"] = "distlock"
            env["DISTLOCK_MYSQL_SOCKET"] = str(run / "mysqld.sock")
            env["DISTLOCK_MYSQL_LOG"] = str(run / "mysqld.err")
        if "memcached" in kinds:
            mc = start_memcached(dir_, next(ports))
            env["DISTLOCK_MEMCACHED"] = f"127.0.0.1:{mc['port']}"
            save()
        if "redis" in kinds:  # last: it needs 2 s from its launch, the others run meanwhile
            wait_redis_cluster(cluster)
            env["DISTLOCK_REDIS_CLUSTER_URL"] = f"redis://127.0.0.1:{cluster[0]['port']}/0"
            env["DISTLOCK_REDIS_CLUSTER_NODES"] = ",".join(
                f"127.0.0.1:{e['port']}" for e in cluster
            )
        if "zookeeper" in kinds:
            wait_zookeeper(zk)
            env["DISTLOCK_ZK_HOSTS"] = ",".join(f"127.0.0.1:{e['port']}" for e in zk)
        if "zookeeper-standalone" in kinds:
            wait_zookeeper_standalone(zk1)
            env["DISTLOCK_ZK_STANDALONE"] = f"127.0.0.1:{zk1['port']}"
    except (StartError, KeyboardInterrupt) as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second ^C must not cut the cleanup
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        save()
        if isinstance(exc, StartError):
            print(f"servers.py: FAILED to start {exc.name}: {exc.reason}", file=sys.stderr)
            if exc.log is not None:
                print(f"--- last lines of {exc.log} ---\n{tail(exc.log)}\n---", file=sys.stderr)
        else:
            print("servers.py: interrupted", file=sys.stderr)
        print("servers.py: stopping the servers already started", file=sys.stderr)
        cmd_stop(dir_)
        return 1
    save()

    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    (dir_ / "env").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    took = time.monotonic() - t0
    print(f"servers.py: started {', '.join(kinds)} in {took:.1f} s ({state_file})", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- install


def cmd_install() -> int:
    """apt-get install the servers if any of their binaries is missing."""
    needed = ["redis-server", "redis-sentinel", "memcached", "java"]
    needed.append("/usr/share/java/zookeeper.jar")
    needed += ["/usr/bin/chromium", "/usr/bin/chromedriver"]  # the admin's browser tests
    needed += ["ip", "iptables"]  # the partition tests
    needed.append("gdb")  # tests/debugger.py
    needed.append(str(PG_BIN / "initdb"))
    needed += ["mariadbd", "mariadb-install-db", "pkg-config", "/usr/bin/mysql_config"]
    missing = [n for n in needed if not (shutil.which(n) or (n[0] == "/" and Path(n).exists()))]
    if not missing:
        print("servers.py: redis, zookeeper, postgresql 15, mariadb, memcached: installed",
              file=sys.stderr)
        return 0
    print(f"servers.py: missing {', '.join(missing)}: apt-get install", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *APT_PACKAGES]):
        rc = subprocess.call(argv, env=env, stdin=subprocess.DEVNULL)
        if rc != 0:
            print(f"servers.py: `{' '.join(argv)}` failed with status {rc}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run install, start or stop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="apt-get install the servers if missing")
    start = sub.add_parser("start", help="start servers into DIR")
    start.add_argument("--dir", required=True, type=Path)
    start.add_argument("--only", default=",".join(KINDS), help=f"subset of {','.join(KINDS)}")
    stop = sub.add_parser("stop", help="stop the servers recorded in DIR/state.json")
    stop.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.command == "install":
        return cmd_install()
    if args.command == "stop":
        return cmd_stop(args.dir.resolve())
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    known = KINDS + EXTRA_KINDS
    if not kinds or set(kinds) - set(known):
        parser.error(f"--only takes a comma-separated subset of {','.join(known)}")
    return cmd_start(args.dir.resolve(), [k for k in known if k in kinds])


if __name__ == "__main__":
    sys.exit(main())
