"""Suites ``orm.save`` and ``orm.sale``: what optimistic locking costs, measured on PostgreSQL.

``orm.save`` (one process): the latency of ``obj.stock += 1; obj.save()`` on a
row read once, for three models alike but for their locking (no version;
django-distlock's ``OptimisticLockMixin``; django-concurrency's
``AutoIncVersionField``), with and without ``update_fields``, cases
interleaved per round as in ``uncontended``; an untimed pass counts the
queries of a save with ``CaptureQueriesContext``.

``orm.sale`` (``--processes`` OS processes, spawn): a flash sale of one
product row, each process buying one unit at a time (one transaction per
purchase: take a unit off the stock, insert an order row) until sold out.
(a) ``bound``: ``filter(pk=pk, stock__gt=0).update(stock=F("stock") - 1)``,
atomic, no read: the ceiling. (b) ``optimistic``: read, check, ``save(
update_fields=["stock"])`` under ``retry_on_conflict``. The stock of a round
is ``--iterations`` units; every round checks that exactly that many were
sold, with no lost update and no oversell.

The models are ``benchmarks/shopbench``; :func:`setup` creates their tables.
``--suite orm`` selects both suites.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import pg
from .contention import STARTUP_TIMEOUT, _get, _worker_failure
from .harness import (
    Case,
    Column,
    Options,
    Row,
    Suite,
    Unavailable,
    add_bar,
    add_case,
    add_suite,
    percentile,
    progress,
    spread_us,
    us,
)

SAVE = "orm.save"
SALE = "orm.sale"
#: Case kind -> model of ``benchmarks.shopbench``.
MODELS = {
    "plain": "PlainProduct",
    "mixin": "OptimisticProduct",
    "concurrency": "ConcurrencyProduct",
}
#: Saves per case in the untimed pass that counts queries.
COUNTED = 20
#: Calls in all of one optimistic purchase (``retry_on_conflict(attempts=...)``).
ATTEMPTS = 100
#: Longest one sale may last; one cut short shows as fewer units sold than stocked.
SALE_DEADLINE = 120.0


# --------------------------------------------------------------------------- setup


def _model(name: str) -> Any:
    from django.apps import apps

    return apps.get_model("shopbench", name)


def setup() -> None:
    """Set the benchmark database up (as ``benchmarks.pg`` does) and create the shop tables.

    Tables missing, or whose columns differ from the models', are (re)created
    with the schema editor; they hold benchmark rows only.

    :raises Unavailable: no PostgreSQL configured, or django-concurrency not installed.
    :raises SystemExit: the configured host is not 127.0.0.1.
    """
    pg.setup()
    from django.apps import apps
    from django.db import connection

    from .shopbench.models import HAS_CONCURRENCY

    if not HAS_CONCURRENCY:
        raise Unavailable(
            "django-concurrency is not installed: pip install -e '.[dev]' "
            "(or pip install django-concurrency)"
        )
    models = list(apps.get_app_config("shopbench").get_models())  # SaleOrder after its product
    with connection.cursor() as cursor:
        existing = set(connection.introspection.table_names(cursor))
        current = all(
            m._meta.db_table in existing
            and {
                c.name
                for c in connection.introspection.get_table_description(cursor, m._meta.db_table)
            }
            == {f.column for f in m._meta.concrete_fields}
            for m in models
        )
    if current:
        return
    with connection.schema_editor() as editor:
        for model in reversed(models):
            if model._meta.db_table in existing:
                editor.delete_model(model)
        for model in models:
            editor.create_model(model)


def describe() -> str:
    """The version of the peer library measured against."""
    from importlib.metadata import version

    return f"django-concurrency {version('django-concurrency')}"


# --------------------------------------------------------------------------- orm.save


class Saver:
    """One product row, read once, then ``obj.stock += 1; obj.save(...)`` per :meth:`step`."""

    def __init__(self, key: str, *, kind: str, update_fields: Sequence[str] | None = None) -> None:
        pg._django()
        model = _model(MODELS[kind])
        model._base_manager.filter(name=key).delete()
        pk = model.objects.create(name=key, price="9.99", stock=0).pk
        self.obj = model.objects.get(pk=pk)  # an existing row, read as a view reads it
        self.kwargs: dict[str, Any] = {}
        if update_fields is not None:
            self.kwargs["update_fields"] = list(update_fields)
        self.saves = 0
        self.first_version = getattr(self.obj, "version", None)

    def step(self) -> None:
        obj = self.obj
        obj.stock += 1
        obj.save(**self.kwargs)
        self.saves += 1

    def check(self) -> None:
        """Raise unless the row holds every save's stock and, if versioned, one bump per save."""
        row = type(self.obj)._base_manager.get(pk=self.obj.pk)
        version = getattr(row, "version", None)
        expected = None if self.first_version is None else self.first_version + self.saves
        if (
            row.stock != self.saves
            or version != expected
            or version != getattr(self.obj, "version", None)
        ):
            raise RuntimeError(
                f"{type(self.obj).__name__} {self.kwargs}: after {self.saves} saves the row has "
                f"stock {row.stock}, version {version} (expected {self.saves}, {expected})"
            )

    def close(self) -> None:
        type(self.obj)._base_manager.filter(pk=self.obj.pk).delete()


def time_saves(saver: Saver, iterations: int, warmup: int) -> list[int]:
    """Time ``iterations`` steps after ``warmup`` untimed ones; ns each, GC off while timing."""
    step, clock = saver.step, time.perf_counter_ns
    for _ in range(warmup):
        step()
    samples = [0] * iterations
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(iterations):
            t0 = clock()
            step()
            samples[i] = clock() - t0
    finally:
        if gc_was_on:
            gc.enable()
    return samples


def count_queries(saver: Saver) -> float:
    """Queries per step, over :data:`COUNTED` untimed steps."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        for _ in range(COUNTED):
            saver.step()
    return len(captured.captured_queries) / COUNTED


def run_saves(cases: Sequence[Case], options: Options) -> list[Row]:
    """Time every case's saves, rounds interleaved; return one row per case."""
    savers: dict[str, Saver] = {}
    samples: dict[str, list[int]] = {case.name: [] for case in cases}
    round_p50: dict[str, list[float]] = {case.name: [] for case in cases}
    queries: dict[str, float] = {}
    try:
        for case in cases:
            saver = case.factory(f"bench:{SAVE}:{case.name}")
            savers[case.name] = saver  # type: ignore[assignment]
            queries[case.name] = count_queries(savers[case.name])
        for round_ in range(options.repeat):
            for case in _rotated(cases, round_):
                progress(f"{SAVE}: round {round_ + 1}/{options.repeat}, {case.name}")
                got = time_saves(savers[case.name], options.iterations, options.warmup)
                samples[case.name] += got
                round_p50[case.name].append(percentile(sorted(got), 50))
        for saver in savers.values():
            saver.check()
    finally:
        for saver in savers.values():
            saver.close()
    rows = []
    for case in cases:
        ordered = sorted(samples[case.name])
        values = {
            "n": len(ordered),
            "p50": percentile(ordered, 50),
            "p99": percentile(ordered, 99),
            "queries": queries[case.name],
            "round_p50": spread_us(round_p50[case.name]),
        }
        rows.append(Row(case, values))
    return rows


def _rotated(items: Sequence[Any], round_: int) -> list[Any]:
    shift = round_ % len(items)
    return [*items[shift:], *items[:shift]]


# --------------------------------------------------------------------------- orm.sale


class Buyer:
    """A customer process' client of the product named ``key``: :meth:`buy` takes one unit.

    ``optimistic=False`` is the bound (a conditional ``UPDATE ... SET stock =
    stock - 1``); ``optimistic=True`` reads, checks and saves the instance,
    re-run by ``retry_on_conflict`` on a :class:`VersionConflict`. Either
    inserts an order row in the same transaction.
    """

    def __init__(self, key: str, *, optimistic: bool) -> None:
        pg._django()
        from django_distlock.contrib.optimistic import retry_on_conflict

        self.product, self.order = _model("OptimisticProduct"), _model("SaleOrder")
        self.pk = self.product.objects.get(name=key).pk  # also opens the connection
        self.worker = 0
        self.conflicts = 0
        attempt = self._optimistic if optimistic else self._bound
        self.buy = retry_on_conflict(attempt, attempts=ATTEMPTS) if optimistic else attempt

    def _bound(self) -> bool:
        from django.db import transaction
        from django.db.models import F

        with transaction.atomic():
            taken = self.product.objects.filter(pk=self.pk, stock__gt=0).update(
                stock=F("stock") - 1
            )
            if not taken:
                return False
            self.order.objects.create(product_id=self.pk, worker=self.worker)
        return True

    def _optimistic(self) -> bool:
        from django.db import transaction

        from django_distlock.exceptions import VersionConflict

        try:
            with transaction.atomic():
                product = self.product.objects.get(pk=self.pk)
                if product.stock <= 0:
                    return False
                product.stock -= 1
                product.save(update_fields=["stock"])
                self.order.objects.create(product_id=self.pk, worker=self.worker)
        except VersionConflict:
            self.conflicts += 1
            raise
        return True

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


Plan = list[tuple[str, Any, str]]  # (case name, Buyer factory, product name)


def _sale_worker(plan: Plan, index: int, rounds: int, barrier: Any, results: Any) -> None:
    """A customer process: per round and case, buy until sold out (or the deadline)."""
    buyers: dict[str, Buyer] = {}
    try:
        for name, factory, key in plan:
            buyers[name] = factory(key)
            buyers[name].worker = index
        from django_distlock.exceptions import VersionConflict

        clock = time.monotonic_ns
        for round_ in range(rounds):
            for name, _, _ in _rotated(plan, round_):
                buyer = buyers[name]
                barrier.wait(STARTUP_TIMEOUT)
                buyer.conflicts = 0
                start = last = clock()
                deadline = start + int(SALE_DEADLINE * 1e9)
                latencies: list[int] = []
                gave_up = 0
                while True:
                    t0 = clock()
                    if t0 > deadline:
                        break
                    try:
                        if not buyer.buy():
                            break  # sold out
                    except VersionConflict:
                        gave_up += 1  # ATTEMPTS conflicts in a row: this customer walks away
                        continue
                    last = clock()
                    latencies.append(last - t0)
                message = (name, start, last, latencies, buyer.conflicts, gave_up)
                results.put(("sale", index, round_, *message))
    except BaseException:
        results.put(("error", index, os.getpid(), traceback.format_exc()))
        barrier.abort()
    finally:
        for buyer in buyers.values():
            buyer.close()


@dataclass
class Sale:
    """One sale of one case, from the workers' reports and the rows left in the database."""

    stock: int
    sold: int  # order rows
    bought: int  # purchases the workers counted
    left: int  # the product's stock after the sale
    seconds: float  # first worker's start -> last purchase
    latencies: list[int]  # ns per purchase, retries included
    conflicts: int
    gave_up: int
    per_process: list[int]


def run_sale(cases: Sequence[Case], options: Options) -> list[Row]:
    """Run every case's sale ``repeat`` times with ``processes`` workers; one row per case."""
    product, order = _model("OptimisticProduct"), _model("SaleOrder")
    stock, processes = options.iterations, options.processes
    plan: Plan = [(c.name, c.factory, f"bench:{SALE}:{c.name}") for c in cases]
    pks = {}
    for name, _, key in plan:
        product._base_manager.filter(name=key).delete()  # cascades to its orders
        pks[name] = product.objects.create(name=key, price="9.99", stock=stock).pk
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=_sale_worker,
            args=(plan, i, options.repeat, barrier, results),
            name=f"bench-buyer-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    sales: dict[str, list[Sale]] = {c.name: [] for c in cases}
    try:
        for round_ in range(options.repeat):
            for name, _, _ in _rotated(plan, round_):
                pk = pks[name]
                order.objects.filter(product_id=pk).delete()
                product.objects.filter(pk=pk).update(stock=stock, version=1)
                progress(
                    f"{SALE}: round {round_ + 1}/{options.repeat}, {name}, "
                    f"{processes} processes buy {stock} units"
                )
                try:
                    barrier.wait(STARTUP_TIMEOUT)
                except threading.BrokenBarrierError:
                    raise _worker_failure(results, "before a sale started") from None
                got = [_get(results, SALE_DEADLINE + STARTUP_TIMEOUT) for _ in range(processes)]
                sales[name].append(_tally(got, name, stock, product, order, pk))
    finally:
        barrier.abort()
        for worker in workers:
            worker.join(timeout=30)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()  # only our own children, by handle
                worker.join(timeout=5)
        for pk in pks.values():
            product._base_manager.filter(pk=pk).delete()
    return [Row(case, _summarise(sales[case.name])) for case in cases]


def _tally(
    got: list[tuple[Any, ...]], name: str, stock: int, product: Any, order: Any, pk: int
) -> Sale:
    per_process = [0] * len(got)
    latencies: list[int] = []
    conflicts = gave_up = 0
    for _, index, _round, case, _start, _last, lat, worker_conflicts, worker_gave_up in got:
        if case != name:
            raise RuntimeError(f"worker {index} reported sale {case!r} during {name!r}")
        per_process[index] = len(lat)
        latencies += lat
        conflicts += worker_conflicts
        gave_up += worker_gave_up
    seconds = (max(m[5] for m in got) - min(m[4] for m in got)) / 1e9
    return Sale(
        stock=stock,
        sold=order.objects.filter(product_id=pk).count(),
        bought=len(latencies),
        left=product.objects.get(pk=pk).stock,
        seconds=max(seconds, 1e-9),
        latencies=latencies,
        conflicts=conflicts,
        gave_up=gave_up,
        per_process=per_process,
    )


def _summarise(sales: Sequence[Sale]) -> dict[str, Any]:
    sold = sum(s.sold for s in sales)
    latencies = sorted(x for s in sales for x in s.latencies)
    per_process = [sum(col) for col in zip(*(s.per_process for s in sales), strict=True)]
    rates = [s.sold / s.seconds for s in sales]
    return {
        "sold": f"{sold} / {sum(s.stock for s in sales)}",
        "rate": sold / sum(s.seconds for s in sales),
        "rate_spread": f"{min(rates):,.0f}..{max(rates):,.0f}",
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        # every conflict but a purchase's last one (when it gave up) was retried
        "retried": (sum(s.conflicts for s in sales) - sum(s.gave_up for s in sales)) / max(sold, 1),
        "gave_up": sum(s.gave_up for s in sales),
        "oversold": sum(max(0, s.sold - s.stock) for s in sales),
        # orders not matched by a unit taken off the stock (lost updates), or the reverse
        "unaccounted": sum(
            abs(s.sold - (s.stock - s.left)) + abs(s.sold - s.bought) for s in sales
        ),
        "left": sum(s.left for s in sales),
        "fairness": f"{min(per_process)} / {max(per_process)}",
    }


# --------------------------------------------------------------------------- --smoke


def smoke_save(case: Case) -> None:
    """``--smoke``: one save of the case's row, checked.

    :raises RuntimeError: when the row does not hold the save.
    """
    saver: Saver = case.factory(f"bench:smoke:{case.suite}:{case.name}")  # type: ignore[assignment]
    try:
        saver.step()
        saver.check()
    finally:
        saver.close()


def smoke_sale(case: Case) -> None:
    """``--smoke``: a product of one unit; one purchase takes it, the next finds it sold out.

    :raises RuntimeError: when the purchases do not go so.
    """
    product, order = _model("OptimisticProduct"), _model("SaleOrder")
    key = f"bench:smoke:{case.suite}:{case.name}"
    product._base_manager.filter(name=key).delete()  # cascades to its orders
    pk = product.objects.create(name=key, price="9.99", stock=1).pk
    buyer: Buyer = case.factory(key)  # type: ignore[assignment]
    try:
        bought, then = buyer.buy(), buyer.buy()
        sold = order.objects.filter(product_id=pk).count()
        if (bought, then, sold) != (True, False, 1):
            raise RuntimeError(f"{case.name}: bought {bought}, then {then}, {sold} order rows")
    finally:
        buyer.close()
        product._base_manager.filter(pk=pk).delete()


# --------------------------------------------------------------------------- registration


def _must_be_zero(value: Any) -> str:
    return str(value) if value == 0 else f"**{value}**"


def _save_notes(options: Options) -> str:
    return (
        f"One process, one row per case, {options.repeat} round(s) x {options.iterations} timed "
        f"`obj.stock += 1; obj.save(...)` (after {options.warmup} untimed) on an instance read "
        "once, autocommit, cases interleaved; `perf_counter_ns` around each step, GC off while "
        f"timing. Times in µs. queries = per save, counted with `CaptureQueriesContext` over "
        f"{COUNTED} untimed saves. `x ref` = p50 / the reference row's p50, same variant."
    )


def _sale_notes(options: Options) -> str:
    return (
        f"{options.processes} OS processes (spawn) buy one unit at a time of one product row "
        f"(stock {options.iterations}) until sold out, {options.repeat} round(s), cases "
        "interleaved; each purchase is one transaction: take a unit off the stock and insert an "
        "order row. purchases/s = units sold / (first process' start → last purchase); latency "
        f"per purchase in µs, retries included; optimistic retries via `retry_on_conflict("
        f"attempts={ATTEMPTS})` (default backoff); oversold and unaccounted (order rows ≠ units "
        "taken off the stock, or ≠ purchases counted) must be 0. `x bound` = purchases/s over "
        "the bound's."
    )


add_suite(
    Suite(
        name=SAVE,
        title="ORM save() of an existing row: no version, django-distlock, django-concurrency",
        run=run_saves,
        columns=(
            Column("n", "n"),
            Column("p50", "p50 µs", us),
            Column("p99", "p99 µs", us),
            Column("queries", "queries/save", lambda v: f"{v:g}"),
            Column("round_p50", "p50 per round"),
        ),
        ratio_metric="p50",
        notes=_save_notes,
        smoke=smoke_save,
    )
)
add_suite(
    Suite(
        name=SALE,
        title="Flash sale: processes buying from one product row",
        run=run_sale,
        columns=(
            Column("sold", "sold / stock"),
            Column("rate", "purchases/s", lambda v: f"{v:,.0f}"),
            Column("rate_spread", "per round"),
            Column("p50", "purchase p50 µs", us),
            Column("p99", "purchase p99 µs", us),
            Column("retried", "conflicts retried / purchase", lambda v: f"{v:.2f}"),
            Column("gave_up", "gave up"),
            Column("oversold", "oversold", _must_be_zero),
            Column("unaccounted", "unaccounted", _must_be_zero),
            Column("left", "stock left"),
            Column("fairness", "purchases min / max"),
        ),
        ratio_metric="rate",
        notes=_sale_notes,
        smoke=smoke_sale,
    )
)

_WHAT = {
    "plain": "no version: Django's `save()`",
    "mixin": "django-distlock `OptimisticLockMixin`",
    "concurrency": "django-concurrency `AutoIncVersionField`",
}
_VARIANTS = (  # (prefix, group, update_fields per kind)
    ("save", "save()", {"plain": None, "mixin": None, "concurrency": None}),
    (
        "save-uf",
        "save(update_fields)",
        # django-concurrency bumps the version only if update_fields names it.
        {"plain": ["stock"], "mixin": ["stock"], "concurrency": ["stock", "version"]},
    ),
)
for _prefix, _group, _fields in _VARIANTS:
    for _kind, _what in _WHAT.items():
        _uf = _fields[_kind]
        add_case(
            SAVE,
            f"{_prefix}.{_kind}",
            functools.partial(Saver, kind=_kind, update_fields=_uf),
            _what + ("" if _uf is None else f", `update_fields={_uf}`"),
            group=_group,
            reference=_kind if _kind != "mixin" else None,
        )
    add_bar(SAVE, f"{_prefix}.mixin", f"{_prefix}.plain", 1.1)
    add_bar(SAVE, f"{_prefix}.mixin", f"{_prefix}.plain", 1.0, metric="queries")
    add_bar(SAVE, f"{_prefix}.mixin", f"{_prefix}.concurrency", 1.0)

add_case(
    SALE,
    "sale.bound",
    functools.partial(Buyer, optimistic=False),
    '(a) `filter(stock__gt=0).update(stock=F("stock") - 1)`: atomic, no read',
    group=pg.GROUP,
    reference="bound",
)
add_case(
    SALE,
    "sale.optimistic",
    functools.partial(Buyer, optimistic=True),
    '(b) read, check, `save(update_fields=["stock"])`, `retry_on_conflict`',
    group=pg.GROUP,
)
add_bar(SALE, "sale.optimistic", "sale.bound", None)
