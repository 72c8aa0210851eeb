"""``manage.py restock``: fire the shop's restock job, as one node of a schedule would."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_distlock import locks
from django_distlock.contrib.schedules import once_per_slot

from ...restock import EVERY, MAX_HOLD, MIN_HOLD, restock, restock_products


def _seconds(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {value}")
    return number


class Command(BaseCommand):
    help = (
        "Fire the shop's restock job as one node of a schedule: run it, or skip at once "
        "when another node has this slot. With no option it fires once now (what a "
        "crontab line on each node calls); with --every it is a node's own scheduler, "
        "firing at every multiple of that many seconds on this node's clock."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--every", type=_seconds, default=None,
            help=f"fire at every multiple of this many seconds (epoch-aligned, as cron "
            f"aligns to minutes); default: fire once now, in the slot of {EVERY:g} s",
        )
        parser.add_argument("--slots", type=int, default=1, help="how many slots to fire")
        parser.add_argument(
            "--start", default=None,
            help="with --every: the first slot is the first multiple at or after this "
            "Unix time (default: the next one); slots already past are missed, as cron "
            "misses the ticks of a node that was down. '-': print 'ready' once connected "
            "to the lock server, then read the time from standard input (a driver starting "
            "several nodes together)",
        )
        parser.add_argument(
            "--clock-offset", type=float, default=0.0,
            help="seconds this node's clock is ahead of the others (negative: behind); "
            "it fires that much early (late)",
        )
        parser.add_argument("--using", default=None, help="the DISTLOCK alias of the job's lock")
        parser.add_argument("--min-hold", type=_seconds, default=None)
        parser.add_argument("--max-hold", type=_seconds, default=None)
        parser.add_argument("--node", default=None, help="this node's name in the history")
        parser.add_argument(
            "--history", default=None,
            help="append one JSON line per firing to this file: node, slot, ran",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        job = self._job(options)
        every = options["every"] or EVERY
        offset = options["clock_offset"]
        node = options["node"] or f"{os.uname().nodename}:{os.getpid()}"
        if options["every"] is None:
            slots = [math.floor((time.time() + offset) / every)]
        else:
            first = math.ceil((self._start(options) + offset) / every)
            slots = list(range(first, first + options["slots"]))
        for slot in slots:
            if options["every"] is not None:
                # Sleep until this node's clock reads the slot's start; a slot whose
                # start has passed (this node came up late) is missed, like cron's.
                wait = slot * every - (time.time() + offset)
                if wait < -min(1.0, every / 4):
                    self.stdout.write(f"slot {slot}: missed (this node was not up)")
                    continue
                time.sleep(max(0.0, wait))
            restocked = job()
            ran = restocked is not None
            self.stdout.write(
                f"slot {slot}: restocked {restocked} product(s)" if ran
                else f"slot {slot}: skipped, another node has it"
            )
            if options["history"]:
                line = json.dumps({"node": node, "slot": slot, "ran": ran, "pid": os.getpid()})
                with open(options["history"], "a", encoding="utf-8") as history:
                    history.write(line + "\n")  # one short write: whole under O_APPEND

    def _start(self, options: dict[str, Any]) -> float:
        """The ``--start`` time: given, now, or (``-``) read after saying ready."""
        start = options["start"]
        if start is None:
            return time.time()
        if start != "-":
            try:
                return float(start)
            except ValueError:
                raise CommandError(f"--start must be a Unix time or '-', not {start!r}") from None
        locks[options["using"] or "default"].is_locked("shop:restock")  # connect first
        self.stdout.write("ready")
        self.stdout.flush()
        line = sys.stdin.readline()
        try:
            return float(line)
        except ValueError:
            raise CommandError(f"expected a Unix time on standard input, got {line!r}") from None

    def _job(self, options: dict[str, Any]) -> Callable[[], int | None]:
        """The shop's job, or the same job on another alias or with other durations."""
        using, min_hold, max_hold = options["using"], options["min_hold"], options["max_hold"]
        if using is None and min_hold is None and max_hold is None:
            return restock
        try:
            return once_per_slot(
                "shop:restock",
                using=using or "default",
                min_hold=MIN_HOLD if min_hold is None else min_hold,
                max_hold=MAX_HOLD if max_hold is None else max_hold,
            )(restock_products)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
