"""``manage.py flashsale``: many processes buy one product at once, with and without locks."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...flashsale import store, via_celery
from ...flashsale.progress import Progress
from ...flashsale.report import StrategyReport, table, verdict
from ...flashsale.runner import run_strategy
from ...flashsale.strategies import Strategy, select


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 60:
        raise argparse.ArgumentTypeError(f"must be between 0 and 60 seconds, got {value}")
    return number


class Command(BaseCommand):
    help = (
        "Flash sale: N worker processes buy one product until it sells out, once per "
        'strategy ("no lock", then the lock of each DISTLOCK alias), and a table shows '
        'that only "no lock" oversells. Exits with status 1 if a locking strategy '
        "oversold or lost a sale."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--workers", type=_positive_int, default=8, help="worker processes (default 8)"
        )
        parser.add_argument(
            "--stock", type=_positive_int, default=50, help="units for sale (default 50)"
        )
        parser.add_argument(
            "--work",
            type=_seconds,
            default=0.001,
            help="seconds of simulated work between the stock check and the decrement "
            "(default 0.001); it widens the race window",
        )
        parser.add_argument(
            "--strategies",
            help='comma-separated: "no-lock" and/or DISTLOCK aliases (default: all)',
        )
        parser.add_argument("--no-progress", action="store_true", help="no live progress line")
        parser.add_argument(
            "--via", choices=("processes", "celery"), default="processes",
            help="who buys: worker processes the command forks (default), or Celery tasks "
            "run by `celery worker` processes it starts (needs a broker: CELERY_BROKER_URL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workers, stock, work = options["workers"], options["stock"], options["work"]
        store.migrate_if_needed()
        strategies = select(options["strategies"])
        progress = Progress(self.stdout, enabled=not options["no_progress"])
        via = options["via"]
        who = "Celery worker children" if via == "celery" else "worker processes"
        self.stdout.write(
            f"Flash sale: {stock} units, {workers} {who}, {work * 1000:g} ms of work "
            f"per purchase, database {store.describe_database()}."
        )
        try:
            with (via_celery.celery_workers(workers) if via == "celery"
                  else contextlib.nullcontext()):
                reports = [self._run(s, stock, workers, work, progress, via) for s in strategies]
        except KeyboardInterrupt:
            progress.close()
            raise CommandError("Interrupted.") from None
        progress.close()
        self.stdout.write("")
        for line in table(reports):
            self.stdout.write(line)
        for report in reports:
            for error in report.errors[:3]:
                self.stdout.write(f"  {report.strategy.label}: {error}")
        passed, line = verdict(reports)
        self.stdout.write("")
        if not passed:
            raise CommandError(line)
        self.stdout.write(self.style.SUCCESS(line))

    def _run(
        self, strategy: Strategy, stock: int, workers: int, work: float, progress: Progress,
        via: str,
    ) -> StrategyReport:
        if strategy.skipped:
            progress.skip(strategy.short)
            return StrategyReport(strategy, stock)
        product = store.reset_product(strategy.label, stock)
        run = via_celery.run_strategy if via == "celery" else run_strategy
        results = run(
            strategy,
            product_id=product.pk,
            stock=stock,
            workers=workers,
            work=work,
            progress=progress,
        )
        sold, stock_left = store.sales(product)
        return StrategyReport.build(strategy, stock, sold, stock_left, results)
