"""The lock-order checker: Linux's lockdep, for lock names.

A thread or task that holds a lock of class A and waits for one of class B records the
order A → B. An acquire that would close a cycle in those orders (B → A seen before,
now A → B; also through longer chains: A → B, B → C, now C → A) is a deadlock that has
not happened yet: two processes taking the two orders at the same moment would each
wait for the other until their timeouts (seed 001's pitfalls). The checker finds it the
first time both orders run, in one process, whatever their timing.

``DISTLOCK_CHECK_ORDER`` (a setting of its own: the graph spans every alias) is
``"raise"`` (the acquire raises :class:`~django_distlock.exceptions.LockOrderViolation`
before any server call), ``"warn"`` (a :class:`LockOrderWarning`) or ``False``; by
default ``"warn"`` under ``DEBUG`` and ``False`` otherwise. Read through the registry
(``handler.py``), and again after ``override_settings``.

A lock's class is its ``order_class=``, else the ``@distlock`` template it came from
(``"order:{order_id}"``), else its name with every segment that holds a digit replaced
by ``*`` (segments are split at ``:``, ``/``, ``.``, ``-``, ``_``, ``=``, ``@``, ``#``,
``,``, ``|`` and spaces): ``order:42`` and ``order:43`` are ``order:*``. Only blocking
acquires are checked (a try-lock cannot wait, as lockdep treats trylocks); locks of one
class taken together, ``multi_lock()``'s own acquisitions (it sorts them) and a
reentrant handle's re-acquisitions record nothing.

The graph is this process' (:data:`GRAPH`); :func:`violations` lists what it found, and
the pytest plugin fails a test that made one. Off, the checker costs the acquire one
comparison and no call.

Across processes, the orders come from a record of past holds: :func:`orders_in` reads
them from holds (each with its holder, name, start and end) and :func:`inversions` finds
the cycles among them. A history of holds registers itself with
:func:`register_history` (the audit app registers its trail); ``manage.py distlock
order`` prints this process' graph and each registered history's orders.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from . import holders
from .exceptions import LockOrderViolation


class _Classed(Protocol):
    """What the checker reads of a ``Hold`` (named here, not imported: ``hold.py``
    imports this module)."""

    name: str
    order_class: str | None

__all__ = [
    "GRAPH",
    "HISTORIES",
    "LockOrderWarning",
    "Order",
    "OrderGraph",
    "PastHold",
    "SeenOrder",
    "inversions",
    "lock_class",
    "orders_in",
    "register_history",
    "violations",
]

#: The mode in force: ``"raise"``, ``"warn"``, False (off), or None (not read yet: the
#: next blocking acquire reads it through the registry).
MODE: str | bool | None = None
#: How the mode is read: the registry's (``handler.py`` sets it, and resets :data:`MODE`
#: on ``setting_changed``).
def _off() -> str | bool:
    return False


read_mode: Callable[[], str | bool] = _off
#: Inside ``multi_lock()``'s own acquisitions (sorted: they cannot form a cycle).
_exempt: ContextVar[bool] = ContextVar("django_distlock_order_exempt", default=False)
_SEPARATORS = re.compile(r"([:/.\-_=@#,| ]+)")
_PACKAGE = str(Path(__file__).resolve().parent)


class LockOrderWarning(RuntimeWarning):
    """Two lock classes were taken in both orders (``DISTLOCK_CHECK_ORDER = "warn"``)."""


@dataclass(frozen=True, order=True)
class Order:
    """A recorded order: class ``first`` held while class ``then`` was acquired, first
    seen at ``where`` (``file:line`` of the acquire, outside this package)."""

    first: str
    then: str
    where: str


@functools.lru_cache(maxsize=4096)  # an acquire classes every lock its holder holds
def lock_class(name: str) -> str:
    """The class of a lock named ``name`` (no ``order_class`` nor template): its segments
    holding a digit become ``*``. Example: ``lock_class("stock:7/eu") == "stock:*/eu"``."""
    return "".join("*" if any(c.isdigit() for c in part) and not _SEPARATORS.fullmatch(part)
                   else part for part in _SEPARATORS.split(name))


class OrderGraph:
    """The orders seen in this process, and the violations found (thread-safe)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._edges: dict[str, dict[str, str]] = {}
        self._violations: list[str] = []

    def orders(self) -> list[Order]:
        """Every order recorded, sorted."""
        with self._mutex:
            return sorted(Order(a, b, where) for a, then in self._edges.items()
                          for b, where in then.items())

    def violations(self) -> list[str]:
        """The messages of the violations found so far, oldest first."""
        with self._mutex:
            return list(self._violations)

    def reset(self) -> None:
        """Forget every order and violation (a test's fresh start)."""
        with self._mutex:
            self._edges.clear()
            self._violations.clear()

    def record(self, held: list[str], wanted: str) -> str | None:
        """Record the orders ``h → wanted`` for each class ``h`` held; return the message
        of a violation (an order that closes a cycle) instead, recording nothing."""
        with self._mutex:
            for first in held:
                path = _path(self._edges, wanted, first)
                if path is not None:
                    message = self._message(first, wanted, path)
                    self._violations.append(message)
                    return message
            where = None
            for first in held:
                then = self._edges.setdefault(first, {})
                if wanted not in then:
                    where = where or _caller()
                    then[wanted] = where
        return None

    def _message(self, first: str, wanted: str, path: list[str]) -> str:
        steps = "; ".join(f"{a!r} then {b!r} at {self._edges[a][b]}"
                          for a, b in itertools.pairwise(path))
        return (
            f"Lock order inverted: acquiring {wanted!r} while holding {first!r} (at "
            f"{_caller()}), but {' -> '.join(repr(c) for c in path)} was taken before "
            f"({steps}). Two processes taking both orders at once would deadlock until "
            "their timeouts: take these locks in one order (multi_lock() sorts them)."
        )


#: This process' graph.
GRAPH = OrderGraph()


def _path(edges: Mapping[str, Iterable[str]], start: str, goal: str) -> list[str] | None:
    """A path ``start`` → ... → ``goal`` through ``edges`` (class → the classes taken
    while holding it), or None."""
    seen = {start}
    stack = [[start]]
    while stack:
        path = stack.pop()
        for then in edges.get(path[-1], ()):
            if then == goal:
                return [*path, then]
            if then not in seen:
                seen.add(then)
                stack.append([*path, then])
    return None


# -- orders across processes, from a record of past holds ------------------------------


@dataclass(frozen=True)
class PastHold:
    """A hold read back from a record: who held (``holder``: one thread or task of one
    process, as ``"host pid 12 MainThread"``), the lock's ``name``, when the hold began
    and ended (the holder's clock), and what the holder was doing (``context``)."""

    holder: str
    name: str
    start: datetime
    end: datetime
    context: str = ""


@dataclass(frozen=True)
class SeenOrder:
    """An order found in past holds: class ``first`` held while class ``then`` was
    acquired, ``count`` times, first by ``example`` (the later hold: its holder, start
    and context)."""

    first: str
    then: str
    count: int
    example: PastHold


def orders_in(holds: Iterable[PastHold]) -> list[SeenOrder]:
    """The orders of ``holds``: ``A → B`` each time a holder's hold of class B began while
    its hold of class A had not ended (classes by :func:`lock_class`: a record keeps
    names, not ``order_class=`` nor templates).

    :param holds: grouped by holder, each holder's sorted by ``start`` (one pass, in
        memory only the holds of one holder still open).
    :returns: the orders, sorted.
    """
    counts: dict[tuple[str, str], list[int]] = {}
    examples: dict[tuple[str, str], PastHold] = {}
    holder = None
    open_holds: list[tuple[datetime, str]] = []
    for hold in holds:
        if hold.holder != holder:
            holder, open_holds = hold.holder, []
        wanted = lock_class(hold.name)
        open_holds = [(end, cls) for end, cls in open_holds if end > hold.start]
        for first in {cls for _, cls in open_holds if cls != wanted}:
            edge = (first, wanted)
            if edge in counts:
                counts[edge][0] += 1
            else:
                counts[edge], examples[edge] = [1], hold
        open_holds.append((hold.end, wanted))
    return [SeenOrder(a, b, counts[(a, b)][0], examples[(a, b)]) for a, b in sorted(counts)]


def inversions(orders: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The cycles among ``orders`` (pairs ``(first, then)``): each as its classes from
    its smallest round to it again (``["a", "b", "a"]``), once, sorted."""
    edges: dict[str, set[str]] = {}
    for first, then in orders:
        edges.setdefault(first, set()).add(then)
    found = set()
    for first in sorted(edges):
        for then in sorted(edges[first]):
            path = _path(edges, then, first)
            if path is not None:
                cycle = [first, *path[:-1]]
                at = cycle.index(min(cycle))
                found.add(tuple(cycle[at:] + cycle[:at]))
    return [[*cycle, cycle[0]] for cycle in sorted(found)]


#: Records of past holds, by label: each a function of a start time (None: all) that
#: yields the holds recorded since, as :func:`orders_in` takes them.
HISTORIES: dict[str, Callable[[datetime | None], Iterable[PastHold]]] = {}


def register_history(label: str, holds: Callable[[datetime | None], Iterable[PastHold]]
                     ) -> None:
    """Register a record of past holds (an app's ``ready()``: the audit app's trail)."""
    HISTORIES[label] = holds


def violations() -> list[str]:
    """The lock-order violations found in this process so far (:data:`GRAPH`'s)."""
    return GRAPH.violations()


def check(hold: _Classed, holder: object) -> None:
    """Before a blocking acquire of ``hold`` by ``holder`` (``Hold.begin``): record its
    orders, or act on a violation as ``DISTLOCK_CHECK_ORDER`` says.

    :raises LockOrderViolation: in ``"raise"`` mode, for an order that closes a cycle.
    """
    global MODE
    mode = MODE
    if mode is None:
        mode = MODE = read_mode()
    if not mode or _exempt.get():
        return
    wanted = hold.order_class or lock_class(hold.name)
    held = {h.order_class or lock_class(h.name) for h in holders.held_by(holder)
            if h is not hold}
    held.discard(wanted)
    if not held:
        return
    message = GRAPH.record(sorted(held), wanted)
    if message is None:
        return
    if mode == "raise":
        raise LockOrderViolation(message)
    filename, line = _caller_frame()
    warnings.warn_explicit(message, LockOrderWarning, filename, line)


@contextlib.contextmanager
def exempt() -> Iterator[None]:
    """Within: acquires record no order (``multi_lock()``'s own, which it sorts)."""
    token = _exempt.set(True)
    try:
        yield
    finally:
        _exempt.reset(token)


def reset_mode() -> None:
    """Read ``DISTLOCK_CHECK_ORDER`` again at the next acquire (``setting_changed``)."""
    global MODE
    MODE = None


def _caller_frame() -> tuple[str, int]:
    """The file and line of the innermost frame outside this package and the standard
    library's ``contextlib``: where the user's code acquires."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE) and not filename.endswith("contextlib.py"):
            return filename, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>", 0


def _caller() -> str:
    filename, line = _caller_frame()
    return f"{filename}:{line}"
