"""Writes the figures part of docs/reliability.md from a figures file (issue 22).

The fault tests call :func:`tests.figures.record` while ``DISTLOCK_FIGURES`` names a
file (``scripts/reliability`` sets it); each call is one JSON line. This module reads
those lines and replaces what lies between the two markers of docs/reliability.md
with one table per scenario, a row per backend::

    python -m tests.reliability_report docs/reliability.jsonl [docs/reliability.md]

Every scenario of :data:`SCENARIOS` gets a section, with "no figures" when the run had
none; a scenario recorded but not described here gets a section too, flagged, so a new
scenario shows up at once and its description is added below.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BEGIN = "<!-- figures:begin (written by python -m tests.reliability_report) -->"
END = "<!-- figures:end -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"

#: Every scenario the report knows: its short name (as recorded) and what it does.
SCENARIOS: dict[str, str] = {
    "mixed": "asyncio tasks, threads and forked processes take one name in rounds, each hold "
    "writing its fencing token; the recorded history is checked (tests/test_hostile.py).",
    "mixed-kinds": "the mixed run with every lock kind the backend offers.",
    "cancelled": "`aacquire()` cancelled at random points while another thread holds and "
    "releases; the name must end free and the holder never miss it for 2 s.",
    "cancelled-kinds": "cancelled acquires of every lock kind the backend offers.",
    "release-fails": "the server frozen (or the holding session terminated) under a "
    "`release()`: a library exception within the lease's end plus a grace.",
    "release-fails-kinds": "a release that fails, for every lock kind.",
    "restart": "the server restarted (from its AOF, snapshot or data dir; every PostgreSQL "
    "session ended) while a lock is held: no second holder, tokens keep growing.",
    "restart-kinds": "a server restart under holders of every lock kind.",
    "waiter-deleted": "a waiter's entry (queue member, node, reservation) deleted under it: "
    "never granted while another holds; the name ends free.",
    "waiter-deleted-kinds": "a waiter's entry deleted, for every lock kind.",
    "kinds-history": "8 processes take every kind of lock the backend offers; the history "
    "is checked (tests/test_kinds_histories.py).",
    "kinds-sigkill": "a holder of each kind SIGKILLed: its share is free again within its "
    "TTL or session timeout plus slack, never before.",
    "sigkill": "a holder process SIGKILLed: the time until another process gets the name.",
    "sigstop": "a holder SIGSTOPped past its lease, then resumed: it finds its lock lost, "
    "cannot release it, and the newcomer's token is larger.",
    "server-killed": "ZooKeeper servers SIGKILLed under a holder and a waiter (the connected "
    "one, the leader: the session survives, nobody else is granted; two of three: a clear "
    "error within its bound).",
    "waiter-faults": "two processes queued behind a holder; the first killed (SIGKILL) or "
    "frozen (SIGSTOP): seconds from the holder's release to the second one's grant, "
    "against the backend's bound.",
    "frozen-server": "the server frozen (SIGSTOP) or stopped under a call (a wait, an "
    "extend, a release): how long the call takes to raise, against its bound.",
    "eviction": "a Redis allowed to evict (`ALLOW_EVICTION`) filled by a cache writer: the "
    "holder's key is evicted and a second holder granted (why it is refused by default).",
    "contention-100": "100 or more processes released at once on one name; a non-blocking "
    "round has exactly one winner.",
    "clock-jump": "the client's wall clock jumps forward and backward: validity follows the "
    "monotonic clock, a jump cannot extend a lease.",
    "exhaustion": "more waiters than pool connections: a clear error, never a second holder.",
    "sentinel-failover": "a Sentinel-managed master killed right after grants, with and "
    "without `WAIT`: the double grant shown without it, none with it.",
    "bad-input": "names, prefixes, cursors, ttl, timeout, limits and owner ids of every "
    "hostile kind: each refused, with no call reaching the server "
    "(tests/test_hostile_input.py; *refused*: kinds of bad value tried).",
    "odd-names": "`/`, `../x`, `{tag}`, glob and `LIKE` characters, NFC and NFD forms, 1 KB "
    "and 1 MB names: each its own lock; what the real server holds (keys, items, nodes, "
    "rows) stays inside the alias' prefix, root or table.",
    "eviction-kinds": "read locks, write locks and permits on a Redis allowed to evict: "
    "the first grant on an evicting server is refused; with `ALLOW_EVICTION`, a reader's "
    "evicted keys let a writer in beside it (why it is refused by default).",
    "partition": "a holder cut off from its server (iptables DROP in a network namespace, "
    "or a forwarder's blackhole): it learns it lost the lock by its lease's end plus the "
    "grace, its calls raise library errors within their bounds, nobody else is granted "
    "before its lease could have ended, its late release frees nothing.",
    "network-delay": "processes contending through a forwarder that delays and stalls "
    "traffic: histories checked, every call within its bound.",
    "sentinel-failover-lagging-replica": "a Sentinel failover where only one replica got "
    "the grants (`WAIT_REPLICAS` = 1): Sentinel promotes that replica, every grant kept.",
    "cache-stampede": "16 processes call `caching.get_or_set` on one missing key at once "
    "(tests/test_caching_processes.py): builds counted by the history checker (must be 1; "
    "Django's own `get_or_set`, the control, builds in many).",
    "cache-hot-key": "6 processes read a key fresh for 0.2 s (stale 0.1 s, early refresh) "
    "for 1 s: rebuilds counted, never two at once.",
    "cache-builder-killed": "a process SIGKILLed while it builds a cache value: seconds "
    "until a waiter has built it instead.",
    "renewal-long-hold": "a worker process keeps a 1 s lease for a long hold with "
    "`auto_renew` while another tries to take it every half second: renewed all along, "
    "never granted to the other.",
    "leadership-campaign": "5 processes campaign for one leadership, 2 terms each "
    "(tests/test_leadership_processes.py): terms checked by the history checker, never "
    "two at once, epochs strictly growing.",
    "leader-killed": "the leader SIGKILLed while another process campaigns: seconds until "
    "the other leads, against the longest a dead leader's term lasts: its lease (ZooKeeper: "
    "the session timeout, and up to a tickTime more: the ensemble expires sessions in "
    "buckets of a tick).",
    "leader-paused": "the leader SIGSTOPped past its lease: seconds until another leads; "
    "resumed, whether it found its term lost at once (it must) before its write, which "
    "the database refuses.",
    "o1-million": "the Redis scripts' server time per call with 1,000,000 other keys and "
    "~10,000 held locks, against an almost empty server (tests/test_redis_o1.py).",
}

#: Seconds past its bound after which a call is marked over: a call bounded by a timeout
#: returns just after it, and a loaded 2-core machine schedules late (the tests allow
#: 0.75 s).
OVER_AFTER = 0.25

#: Figures with a header of their own, in this order; any other figure follows them.
COLUMNS: dict[str, str] = {
    "processes": "processes",
    "workers": "workers",
    "kinds": "kinds",
    "acquisitions": "acquisitions checked",
    "grants": "grants",
    "overlaps": "overlaps found",
    "repeated_tokens": "tokens repeated",
    "stale_writes_accepted": "stale writes accepted",
    "ttl_s": "TTL (s)",
    "freed_s": "time to free after a crash (s)",
    "worst_call_s": "worst call (s)",
    "bound_s": "its bound (s)",
    "keys": "other keys",
    "held": "held locks",
    "empty_usec": "server µs per call, almost empty",
    "full_usec": "server µs per call, full",
    "ratio": "ratio",
    "bound_ratio": "its bound",
    "commands_per_call": "commands per call",
}
#: Fields of a record that describe the run, not the scenario.
_RUN = ("scenario", "backend", "at", "pid", "cpus", "soak")
#: Figures that are not merged by adding: the largest of a run's records is shown.
_LARGEST = re.compile(r"(_s|_ratio|_usec)$|^(worst|max|bound)")


def load(path: Path) -> list[dict[str, Any]]:
    """The records of a figures file (blank lines skipped)."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def merge(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{scenario: {backend: figures}}``; several records of one pair are merged: counts
    added, times and bounds (``*_s``, ``worst*``, ``bound*``) their largest, others the last."""
    merged: dict[str, dict[str, dict[str, Any]]] = {}
    for found in records:
        figures = {k: v for k, v in found.items() if k not in _RUN}
        row = merged.setdefault(found["scenario"], {}).setdefault(found["backend"], {})
        for key, value in figures.items():
            old = row.get(key)
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if old is None or not numeric or isinstance(old, bool):
                row[key] = value
            elif _LARGEST.search(key):
                row[key] = max(old, value)
            else:
                row[key] = old + value
    return merged


def _cell(key: str, row: dict[str, Any]) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if isinstance(value, float):
        value = f"{value:g}"
    text = str(value)
    bound = row.get("bound_ratio" if key == "ratio" else "bound_s")
    if key in ("worst_call_s", "freed_s", "ratio") and isinstance(bound, int | float) and \
            row[key] > bound + (0 if key == "ratio" else OVER_AFTER):
        text += " **over**"
    if key in ("overlaps", "repeated_tokens", "stale_writes_accepted") and value:
        text = f"**{text}**"
    return text


def table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """A Markdown table: a row per backend, a column per figure any row has."""
    present = {key for row in rows.values() for key in row}
    keys = [key for key in COLUMNS if key in present] + sorted(present - set(COLUMNS))
    lines = ["| backend | " + " | ".join(COLUMNS.get(k, k.replace("_", " ")) for k in keys)
             + " |", "|---" * (len(keys) + 1) + "|"]
    for backend in sorted(rows):
        lines.append(f"| {backend} | " + " | ".join(_cell(k, rows[backend]) for k in keys)
                     + " |")
    return lines


def render(merged: dict[str, dict[str, dict[str, Any]]], when: str, note: str = "") -> str:
    """The text between the markers: a section per scenario, known ones first."""
    lines = [f"Figures of the last run ({when}{', ' + note if note else ''}). A figure in bold "
             "is one the scenario must keep at zero, or a call past its bound; see each "
             "backend's promises below for the rows where that is expected.", ""]
    names = list(SCENARIOS) + sorted(set(merged) - set(SCENARIOS))
    for name in names:
        lines += [f"### `{name}`", ""]
        lines.append(SCENARIOS.get(name, "**Not described** in tests/reliability_report.py "
                                         "(add it to SCENARIOS)."))
        lines.append("")
        lines += table(merged[name]) if name in merged else ["No figures in the last run."]
        lines.append("")
    return "\n".join(lines)


def render_records(records: list[dict[str, Any]]) -> str:
    """:func:`render` of a run's records, dated and described by them."""
    when = datetime.fromtimestamp(max((r["at"] for r in records), default=0), UTC)
    note = "`--soak` sizes" if any(r.get("soak") for r in records) else "CI sizes"
    cpus = max((r.get("cpus") or 0 for r in records), default=0)
    note += f", {cpus} CPUs" if cpus else ""
    return render(merge(records), when.strftime("%Y-%m-%d %H:%M UTC"), note)


def block_of(doc: str) -> str:
    """What lies between the markers of ``doc`` (as :func:`write` puts it)."""
    return doc.split(BEGIN, 1)[1].split(END, 1)[0]


def scenario_names(doc: str) -> list[str]:
    """The scenario sections between the markers of ``doc``, in order."""
    return re.findall(r"^### `([^`]+)`$", block_of(doc), flags=re.M)


def write(doc_path: Path, block: str) -> None:
    """Replace what lies between the markers of ``doc_path`` with ``block``."""
    doc = doc_path.read_text(encoding="utf-8")
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{doc_path}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc_path.write_text(f"{head}{BEGIN}\n\n{block}\n{END}{tail}", encoding="utf-8")


def main(argv: Sequence[str]) -> int:
    """``python -m tests.reliability_report FIGURES [DOC]``; returns the exit status."""
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    records = load(Path(argv[0]))
    write(Path(argv[1]) if len(argv) > 1 else DOC, render_records(records))
    print(f"{len(records)} records of {len({r['scenario'] for r in records})} scenarios written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
