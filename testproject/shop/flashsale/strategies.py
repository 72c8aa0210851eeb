"""What a flash sale compares: "no lock", one strategy per ``DISTLOCK`` alias,
optimistic locking (the version column), and fenced writes under the default lock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.core.management.base import CommandError

from django_distlock import locks
from django_distlock.backends.base import BaseLockBackend

from .. import services
from . import store

NO_LOCK = "no lock"
_NO_LOCK_NAMES = frozenset({NO_LOCK, "no-lock", "nolock", "none"})
#: Kinds of strategy: how ``Strategy.buy`` sells.
NONE, LOCK, OPTIMISTIC, FENCED = "none", "lock", "optimistic", "fenced"
#: The alias whose lock the fenced strategy holds.
FENCED_ALIAS = "default"


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way of selling: no lock, the lock of one alias, optimistic, or fenced."""

    label: str
    #: The ``DISTLOCK`` alias whose lock guards the sale; None for "no lock" and optimistic.
    alias: str | None = None
    #: Why the strategy cannot run (backend not buildable, server down); None if it can.
    skipped: str | None = None
    kind: str = LOCK

    @property
    def locking(self) -> bool:
        """Whether this strategy promises not to oversell (all but "no lock")."""
        return self.kind != NONE

    @property
    def short(self) -> str:
        """What the progress line shows: the alias, "no lock", "optimistic" or "fenced"."""
        if self.kind == LOCK:
            return self.alias or NO_LOCK
        return NO_LOCK if self.kind == NONE else self.kind

    def buy(self, product_id: int, *, worker: str, work: float) -> services.Attempt:
        """Make one purchase attempt with this strategy."""
        label = self.label
        if self.kind == NONE:
            return services.buy_no_lock(product_id, strategy=label, worker=worker, work=work)
        if self.kind == OPTIMISTIC:
            return services.buy_optimistic(product_id, strategy=label, worker=worker, work=work)
        assert self.alias is not None
        buy = services.buy_fenced if self.kind == FENCED else services.buy_with_lock
        return buy(product_id, self.alias, strategy=label, worker=worker, work=work)

    def matches(self, name: str) -> bool:
        """Whether ``name`` (from ``--strategies``) selects this strategy."""
        name = name.strip().lower()
        if self.kind == NONE:
            return name in _NO_LOCK_NAMES
        if self.kind in (OPTIMISTIC, FENCED):
            return name in (self.kind, self.label.lower())
        return name in ((self.alias or "").lower(), self.label.lower())


def describe(alias: str, backend: BaseLockBackend | None) -> str:
    """Label an alias by its ``BACKEND`` class and mode: ``database lease (default)``."""
    params = locks.settings.get(alias, {})
    class_name = str(params.get("BACKEND", "")).rpartition(".")[2] or "unknown"
    mode = getattr(backend, "mode", None)
    if mode is None:
        options = params.get("OPTIONS")
        mode = options.get("MODE") if isinstance(options, Mapping) else None
    kind = class_name.removesuffix("Backend").lower() or class_name.lower()
    return f"{kind} {mode} ({alias})" if mode else f"{kind} ({alias})"


def _build(alias: str) -> tuple[BaseLockBackend | None, str | None]:
    try:
        return locks[alias], None
    except Exception as exc:  # any setup mistake skips the alias, with the reason
        return None, f"backend could not be built: {_reason(exc)}"


def _probe(strategy: Strategy) -> Strategy:
    """Return ``strategy``, or a skipped copy if its server does not answer."""
    if strategy.alias is None or strategy.skipped:
        return strategy
    try:
        backend = locks[strategy.alias]
        database = getattr(backend, "database", None)  # the database backend's tables
        if isinstance(database, str):
            store.migrate_if_needed(database)
        backend.health()
    except Exception as exc:  # a server that is down skips the alias, with the reason
        reason = f"server unavailable: {_reason(exc)}"
        return Strategy(strategy.label, strategy.alias, reason, strategy.kind)
    return strategy


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def available() -> list[Strategy]:
    """Every strategy, in order: no lock, the aliases in ``DISTLOCK`` order, optimistic,
    fenced (no I/O)."""
    found = [Strategy(NO_LOCK, kind=NONE)]
    for alias in locks:
        backend, problem = _build(alias)
        found.append(Strategy(describe(alias, backend), alias, problem))
    found.append(Strategy("optimistic (version column, retry)", kind=OPTIMISTIC))
    backend, problem = _build(FENCED_ALIAS)
    label = f"fenced writes, {describe(FENCED_ALIAS, backend)}"
    found.append(Strategy(label, FENCED_ALIAS, problem, kind=FENCED))
    return found


def select(names: str | None) -> list[Strategy]:
    """Return the strategies ``--strategies`` names (all when None), health-checked.

    :raises CommandError: for a name that matches no strategy.
    """
    every = available()
    if not names:
        chosen = every
    else:
        chosen = []
        for name in filter(None, (part.strip() for part in names.split(","))):
            match = next((s for s in every if s.matches(name)), None)
            if match is None:
                aliases = [s.alias for s in every if s.kind == LOCK and s.alias]
                known = ", ".join(["no-lock", *aliases, OPTIMISTIC, FENCED])
                raise CommandError(f"Unknown strategy {name!r}; choose from: {known}.")
            if match not in chosen:
                chosen.append(match)
    probed = [_probe(strategy) for strategy in chosen]
    locks.close_all()  # the probes' connections belong to this process only
    return probed
