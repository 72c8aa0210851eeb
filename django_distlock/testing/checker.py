"""Check a recorded lock history: mutual exclusion, fencing tokens, an invariant.

See :mod:`django_distlock.testing.history` for how histories are recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..kinds import Kind

__all__ = [
    "Event",
    "HistoryError",
    "HistoryReport",
    "Hold",
    "Overlap",
    "RepeatedToken",
    "Write",
    "check",
    "stock",
]

#: One recorded event: a JSON object with ``t`` (``time.monotonic_ns()``), ``pid``,
#: ``thread``, ``task``, ``ev`` (the event kind), ``name`` and the kind's fields.
Event = dict[str, Any]


@dataclass
class Hold:
    """One grant (or acquire of unknown outcome) from start to end, in monotonic ns."""

    op: str
    name: str
    kind: str
    limit: int | None
    pid: int
    start: int
    end: int = -1  #: the release (or the end of the history, of the process)
    valid_end: int = -1  #: ``end``, or earlier: a loss notice or the lease's end
    token: int | None = None
    unknown: bool = False  #: whether the acquire's outcome was unknown
    until: int | None = None
    invalid_at: int | None = None

    def describe(self, t0: int) -> str:
        """One line for messages, times in ms from ``t0``."""
        what = "unknown-outcome acquire" if self.unknown else f"{self.kind} hold"
        return (f"{what} {self.op} (pid {self.pid}, token {self.token}) "
                f"{(self.start - t0) / 1e6:.3f}..{(self.end - t0) / 1e6:.3f} ms")


@dataclass
class Overlap:
    """Holds of one name that were held together though they may not be."""

    name: str
    holds: tuple[Hold, ...]
    at: int  #: when the overlap began (monotonic ns)


@dataclass
class RepeatedToken:
    """A fencing token granted to more than one acquisition of ``name``."""

    name: str
    token: int
    holds: tuple[Hold, ...]


@dataclass
class Write:
    """A recorded guarded write; ``t`` is when storage answered, ``began`` when it was sent."""

    name: str
    token: int | None
    accepted: bool
    value: Any
    t: int
    began: int
    pid: int


@dataclass
class HistoryReport:
    """What :func:`check` found; :attr:`ok` when nothing is wrong."""

    overlaps: list[Overlap] = field(default_factory=list)
    #: Claimed holds that overlapped only after one had a loss notice (allowed).
    overlaps_after_loss: list[Overlap] = field(default_factory=list)
    repeated_tokens: list[RepeatedToken] = field(default_factory=list)
    #: (earlier hold, later hold) of one name, exclusive or write, both valid for a while:
    #: the later grant carries a lower token (tokens must grow with every grant).
    tokens_out_of_order: list[tuple[Hold, Hold]] = field(default_factory=list)
    #: (earlier write, later write): the later accepted write has a lower token.
    backwards_writes: list[tuple[Write, Write]] = field(default_factory=list)
    invariant_errors: list[str] = field(default_factory=list)
    holds: int = 0
    processes: int = 0
    writes: int = 0
    t0: int = 0

    @property
    def ok(self) -> bool:
        """Whether no overlap of valid holds, repeated token, token out of order, backwards
        write or invariant error was found."""
        return not (self.overlaps or self.repeated_tokens or self.tokens_out_of_order
                    or self.backwards_writes or self.invariant_errors)

    def __str__(self) -> str:
        lines = [f"{self.holds} holds of {self.processes} processes, {self.writes} writes: "
                 + ("ok" if self.ok else "BAD")]
        for o in self.overlaps[:3]:
            holds = " / ".join(h.describe(self.t0) for h in o.holds)
            lines.append(f"overlap on {o.name!r}: {holds}")
        for r in self.repeated_tokens[:3]:
            lines.append(f"token {r.token} of {r.name!r} granted {len(r.holds)} times: "
                         + " / ".join(h.describe(self.t0) for h in r.holds))
        for earlier, later in self.tokens_out_of_order[:3]:
            lines.append(f"token {later.token} of {later.name!r} granted after token "
                         f"{earlier.token}: {earlier.describe(self.t0)} / "
                         f"{later.describe(self.t0)}")
        for a, b in self.backwards_writes[:3]:
            lines.append(f"write of {b.name!r} with token {b.token} (pid {b.pid}) accepted after "
                         f"one with token {a.token} (pid {a.pid})")
        lines += self.invariant_errors[:3]
        if self.overlaps_after_loss:
            lines.append(f"({len(self.overlaps_after_loss)} overlaps after a loss notice: allowed)")
        return "\n".join(lines)

    def raise_if_bad(self) -> None:
        """:raises HistoryError: naming the first problems, unless :attr:`ok`."""
        if not self.ok:
            raise HistoryError(str(self))


class HistoryError(AssertionError):
    """A checked history shows a broken lock, fencing or invariant."""


def _holds(events: Sequence[Event]) -> list[Hold]:
    """Rebuild the holds (and unknown-outcome acquires) from time-ordered events."""
    ops: dict[str, Hold] = {}
    invoked: dict[str, Event] = {}
    end_of_history = events[-1]["t"] if events else 0
    for e in events:
        ev, op = e["ev"], str(e.get("op"))
        if ev == "invoke":
            invoked[op] = e
        elif ev in ("granted", "unknown") and op in invoked:
            i = invoked[op]
            hold = ops[op] = Hold(op, i["name"], i["kind"], i["limit"], e["pid"],
                                  i["t"] if ev == "unknown" else e["t"], unknown=ev == "unknown")
            hold.token, hold.until = e.get("token"), e.get("until")
            if ev == "unknown" and e.get("ttl") is not None:
                hold.end = e["t"] + e["ttl"]
        elif ev == "renewed" and op in ops:
            ops[op].until = max(ops[op].until or 0, e["until"])
        elif ev in ("lost", "unsure") and op in ops:
            at = e["t"] if e.get("at") is None else e["at"]
            ops[op].invalid_at = min(at, ops[op].invalid_at or at)
        elif ev == "released" and op in ops and ops[op].end < 0:
            ops[op].end = e["t"]
        elif ev == "ended":
            for hold in ops.values():
                if hold.pid == e["victim"] and (hold.end < 0 or hold.end > e["t"]):
                    hold.end = e["t"]
    for hold in ops.values():
        hold.end = end_of_history if hold.end < 0 else hold.end
        bounds = [b for b in (hold.until, hold.invalid_at) if b is not None]
        hold.valid_end = max(hold.start, min([hold.end, *bounds]))
    return list(ops.values())


def _overlaps(holds: list[Hold], valid: bool) -> list[Overlap]:
    """Sweep each name's holds by start: a read admits reads, a semaphore ``limit`` holds."""
    found: list[Overlap] = []
    active: dict[str, list[Hold]] = {}
    ends = (lambda a: a.valid_end) if valid else (lambda a: a.end)
    for h in sorted(holds, key=lambda h: h.start):
        if ends(h) <= h.start:
            continue
        now = active[h.name] = [a for a in active.get(h.name, []) if ends(a) > h.start]
        sems = [a for a in now if a.kind == Kind.SEMAPHORE] if h.kind == Kind.SEMAPHORE else []
        if h.limit is not None and len(sems) >= h.limit:
            found.append(Overlap(h.name, (*sems, h), h.start))
        for a in now:
            if a not in sems and not (a.kind == h.kind == Kind.READ):
                found.append(Overlap(h.name, (a, h), h.start))
        now.append(h)
    return found


def _out_of_order(holds: list[Hold]) -> list[tuple[Hold, Hold]]:
    """Exclusive or write holds of a name, each valid for a while, in grant order (valid
    holds of a name do not overlap, so their starts order their grants), whose token is
    lower than the one before."""
    found = []
    last: dict[str, Hold] = {}
    for h in sorted(holds, key=lambda h: h.start):
        if h.token is None or h.kind not in (Kind.EXCLUSIVE, Kind.WRITE) or h.valid_end <= h.start:
            continue
        before = last.get(h.name)
        if before is not None and h.token < before.token:  # type: ignore[operator]
            found.append((before, h))
        last[h.name] = h
    return found


def _backwards(writes: list[Write]) -> list[tuple[Write, Write]]:
    """Accepted writes whose token is lower than one accepted and answered before they began."""
    found = []
    by_name: dict[str, list[Write]] = {}
    for w in writes:
        if w.accepted and w.token is not None:
            by_name.setdefault(w.name, []).append(w)
    for group in by_name.values():
        done = sorted(group, key=lambda w: w.t)
        highest: Write | None = None
        index = 0
        for w in sorted(group, key=lambda w: w.began):
            while index < len(done) and done[index].t < w.began:
                if highest is None or done[index].token > highest.token:  # type: ignore[operator]
                    highest = done[index]
                index += 1
            if highest is not None and w.token < highest.token:  # type: ignore[operator]
                found.append((highest, w))
    return found


def check(
    events: Sequence[Event], *, invariant: Callable[[list[Write]], list[str]] | None = None
) -> HistoryReport:
    """Check a history (see :func:`load`) for mutual exclusion, fencing and ``invariant``.

    :param invariant: called with every recorded write in the order storage answered
        them; returns error messages (e.g. :func:`stock`).
    :returns: the report; call :meth:`HistoryReport.raise_if_bad` in a test.
    """
    events = sorted(events, key=lambda e: e["t"])
    holds = _holds(events)
    writes = [Write(e["name"], e["token"], e["accepted"], e.get("value"), e["t"],
                    e["t"] if e.get("began") is None else e["began"], e["pid"])
              for e in events if e["ev"] == "write"]
    report = HistoryReport(holds=len(holds), processes=len({e["pid"] for e in events}),
                           writes=len(writes), t0=events[0]["t"] if events else 0)
    report.overlaps = _overlaps(holds, valid=True)
    bad = {frozenset(h.op for h in o.holds) for o in report.overlaps}
    report.overlaps_after_loss = [o for o in _overlaps(holds, valid=False)
                                  if frozenset(h.op for h in o.holds) not in bad]
    tokens: dict[tuple[str, int], list[Hold]] = {}
    for h in holds:
        if h.token is not None:
            tokens.setdefault((h.name, h.token), []).append(h)
    report.repeated_tokens = [RepeatedToken(n, t, tuple(hs))
                              for (n, t), hs in tokens.items() if len(hs) > 1]
    report.tokens_out_of_order = _out_of_order(holds)
    report.backwards_writes = _backwards(writes)
    report.invariant_errors = invariant(writes) if invariant else []
    return report


def stock(initial: int, *, name: str | None = None, final: int | None = None) -> Callable[
    [list[Write]], list[str]
]:
    """An invariant for :func:`check`: stock never negative, sold + left = initial.

    Each accepted write's value is ``{"sold": units sold by it, "left": stock it wrote}``.

    :param name: only the writes guarded by this lock name (default: all).
    :param final: the stock read from storage at the end (default: the ``left`` of the
        last accepted write).
    """

    def invariant(writes: list[Write]) -> list[str]:
        done = [w for w in writes if w.accepted and (name is None or w.name == name)]
        errors = [f"stock went negative: {w.value['left']} written with token {w.token} "
                  f"(pid {w.pid})" for w in done if w.value["left"] < 0]
        sold = sum(w.value.get("sold", 1) for w in done)
        left = final if final is not None else done[-1].value["left"] if done else initial
        if sold + left != initial:
            errors.append(f"sold {sold} + left {left} != initial {initial}")
        return errors

    return invariant
