"""``manage.py distlock``: list, inspect and force-release held locks, prune the database
backend's idle rows, check each alias' health (exit status 1 when one fails: a container
probe), run a command on one host at a time (``singleton``: ``singleton.py``), print the
lock orders seen and any inverted pair (``order``: ``ordering.py``). The audit trail's
purge is ``manage.py distlock_audit purge`` (the audit app)."""

from __future__ import annotations

import getpass
import json
import sys
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_distlock import ordering
from django_distlock.exceptions import DistLockError, InvalidLockName, LockConfigurationError
from django_distlock.handler import DEFAULT_LOCK_ALIAS, locks
from django_distlock.health import check_health
from django_distlock.housekeeping import prunable
from django_distlock.singleton import run_singleton
from django_distlock.values import DEFAULT, LockInfo

from ...operations.bulk import MAX_PER_ACTION
from ...operations.listing import BadPosition, find_lock, read_page
from ...operations.release import release_audited
from ...operations.waiting import waiter_dict, who_waits
from ._release import MAX_REASON, checked_reason, confirm, release_bulk
from ._release import as_dict as _as_dict

__all__ = ["MAX_REASON", "Command"]


def _alias_scoped(issue: checks.CheckMessage) -> bool:
    """Whether ``issue`` is a ``distlock`` check's error about one configured alias."""
    aliases = getattr(settings, "DISTLOCK", None) or {}
    return (
        (issue.id or "").startswith("distlock.")
        and isinstance(issue.obj, str)
        and issue.obj in aliases
    )


class Command(BaseCommand):
    help = "List, inspect or force-release held locks; prune idle rows; check health."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="held locks of every alias that can list")
        listing.add_argument("--alias", action="append", help="only this alias (repeatable)")
        listing.add_argument("--prefix", default="", help="only names starting with this")
        listing.add_argument("--limit", type=int, default=100, help="at most this many (100)")
        listing.add_argument("--json", action="store_true")
        inspect = sub.add_parser("inspect", help="one lock")
        inspect.add_argument("alias")
        inspect.add_argument("name")
        inspect.add_argument("--json", action="store_true")
        release = sub.add_parser(
            "release",
            help="force-release one lock, or every lock of a host, process, owner or prefix "
            "(audited)",
        )
        release.add_argument("alias", nargs="?", help="one lock: its alias")
        release.add_argument("name", nargs="?", help="one lock: its name")
        release.add_argument("--reason", help="why (recorded; required unless --dry-run)")
        release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        bulk = release.add_argument_group(
            "bulk release", "every lock held matching all the criteria given, checked per lock "
            f"on the server (at most {MAX_PER_ACTION:,} per run)"
        )
        bulk.add_argument("--host", default="", help="held by this host")
        bulk.add_argument("--pid", type=int, help="and this process id (with --host)")
        bulk.add_argument("--owner", default="", help="held by this owner id (8 hex digits)")
        bulk.add_argument("--prefix", default="", help="names starting with this")
        bulk.add_argument(
            "--alias", dest="aliases", action="append", help="only this alias (repeatable)"
        )
        bulk.add_argument("--dry-run", action="store_true", help="list what would be freed")
        bulk.add_argument("--json", action="store_true")
        prune = sub.add_parser("prune", help="delete the database backend's idle lock rows")
        prune.add_argument("--alias", action="append", help="only this alias (repeatable)")
        prune.add_argument("--idle", type=float, default=3600.0,
                           help="rows idle for this many seconds (3600)")
        prune.add_argument("--batch", type=int, default=1000, help="rows per transaction")
        health = sub.add_parser("health", help="one round trip per alias; exit 1 if one fails")
        health.add_argument("--json", action="store_true")
        singleton = sub.add_parser(
            "singleton",
            help="run a command only while this process leads NAME, on one host at a time "
            "(docs/leadership.md): manage.py distlock singleton beat -- celery -A proj beat",
        )
        singleton.add_argument("name", help="the leadership's name")
        singleton.add_argument("--using", default=DEFAULT_LOCK_ALIAS,
                               help="the DISTLOCK alias (default: 'default')")
        singleton.add_argument("--ttl", type=float, help="the term's lease in seconds "
                               "(default: the alias' TTL)")
        singleton.add_argument("--grace", type=float, default=5.0,
                               help="seconds from the child's SIGTERM to its SIGKILL (5)")
        singleton.add_argument("command", nargs="*", help="-- then the command and its "
                               "arguments (after --, options are the command's)")

        order = sub.add_parser(
            "order",
            help="the lock orders seen (this process' graph, and each record of past holds: "
            "the audit trail) and any inverted pair; exit 1 with --check if one is found",
        )
        order.add_argument("--since", type=float, default=24.0,
                           help="holds that ended in the last this many hours (24; 0: all)")
        order.add_argument("--check", action="store_true",
                           help="exit 1 when an order is inverted (for CI or cron)")
        order.add_argument("--json", action="store_true")

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Run the system checks as every command does, except that errors of single
        ``DISTLOCK`` aliases only warn: ``list`` and ``health`` report such an alias as
        misconfigured and still serve the others (one bad alias must not lock the
        operator out of every subcommand).

        :raises SystemCheckError: when another check fails, as ``BaseCommand.check``.
        """
        fail_level = kwargs.get("fail_level", checks.ERROR)
        silenced = set(settings.SILENCED_SYSTEM_CHECKS)
        issues = [
            issue
            for issue in checks.run_checks(
                app_configs=kwargs.get("app_configs"),
                tags=kwargs.get("tags"),
                include_deployment_checks=kwargs.get("include_deployment_checks", False),
                databases=kwargs.get("databases"),
            )
            if issue.is_serious(fail_level) and issue.id not in silenced
        ]
        if not issues or not all(_alias_scoped(issue) for issue in issues):
            super().check(*args, **kwargs)
            return
        for issue in issues:
            self.stderr.write(f"{issue.obj}: misconfigured ({issue.id}): {issue.msg}")

    def run_from_argv(self, argv: list[str]) -> None:
        """``singleton NAME [options] -- COMMAND ...``: what follows the first ``--`` is
        the command, kept from argparse (whose subcommands do not take ``--``)."""
        self._command: list[str] | None = None
        if "singleton" in argv[2:3] and "--" in argv:
            at = argv.index("--")
            argv, self._command = argv[:at], argv[at + 1:]
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"do_{options['action']}")(**options)

    def do_singleton(
        self, *, name: str, using: str, ttl: float | None, grace: float, command: list[str],
        **options: Any,
    ) -> None:
        self._alias(using)
        command = getattr(self, "_command", None) or command  # call_command: no "--"
        if not command:
            raise CommandError("singleton needs a command: distlock singleton NAME -- COMMAND ...")
        try:
            status = run_singleton(
                name, command, using=using, ttl=DEFAULT if ttl is None else ttl, grace=grace,
                say=lambda line: self.stderr.write(f"distlock singleton: {line}"),
            )
        except (DistLockError, TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if status:
            sys.exit(status)

    def do_order(self, *, since: float, check: bool, **options: Any) -> None:
        if since < 0:
            raise CommandError("--since must be 0 (all) or more hours.")
        start = None if not since else timezone.now() - timedelta(hours=since)
        # The process' graph never holds an inverting order (the checker refuses to record
        # one): what it found is its violations, each message naming both orders.
        found: dict[str, dict[str, Any]] = {"this process": {
            "orders": [{"first": o.first, "then": o.then, "where": o.where}
                       for o in ordering.GRAPH.orders()],
            "violations": ordering.violations(),
        }}
        for label, history in ordering.HISTORIES.items():
            seen = ordering.orders_in(history(start))
            found[label] = {
                "orders": [{"first": o.first, "then": o.then, "count": o.count,
                            "where": _where(o.example)} for o in seen],
                "inversions": ordering.inversions((o.first, o.then) for o in seen),
            }
        if options["json"]:
            self.stdout.write(json.dumps(found))
        else:
            for label, part in found.items():
                since_text = "" if label == "this process" else (
                    f" (holds ended since {start:%Y-%m-%d %H:%M} UTC)" if start else " (all)")
                self.stdout.write(f"Orders seen in {label}{since_text}:")
                if not part["orders"]:
                    self.stdout.write("  none")
                for seen_order in part["orders"]:
                    count = seen_order.get("count")
                    times = f", {count} time{'s' * (count != 1)}" if count else ""
                    self.stdout.write(f"  {seen_order['first']} -> {seen_order['then']}"
                                      f"{times}; first at {seen_order['where']}")
                for message in part.get("violations", ()):
                    self.stdout.write(f"  INVERTED: {message}")
                for cycle in part.get("inversions", ()):
                    self.stdout.write(f"  INVERTED: {' -> '.join(cycle)} (two holders taking "
                                      "these orders at once would deadlock)")
        if check and any(part.get("violations") or part.get("inversions")
                         for part in found.values()):
            raise CommandError("Lock orders are inverted: take these locks in one order "
                               "(multi_lock() sorts them).", returncode=1)

    def _alias(self, alias: str) -> None:
        if alias not in locks:
            raise CommandError(f"No lock alias {alias!r}; DISTLOCK has {sorted(locks)}.")

    def do_list(self, *, alias: list[str] | None, prefix: str, limit: int, **options: Any) -> None:
        for one in alias or []:
            self._alias(one)
        if limit < 1:
            raise CommandError("--limit must be at least 1.")
        rows: list[LockInfo] = []
        position = None
        errors: dict[str, str] = {}
        try:
            while len(rows) < limit:
                page = read_page(
                    alias or list(locks), prefix, min(limit - len(rows), 1000), position
                )
                rows += [row.info for row in page.rows]
                errors.update({s.alias: s.error for s in page.aliases if s.error})
                if page.next_position is None:
                    break
                position = page.next_position
        except (InvalidLockName, ValueError, BadPosition) as exc:
            raise CommandError(f"--prefix: {exc}") from exc
        if options["json"]:
            self.stdout.write(json.dumps({"locks": [_as_dict(i) for i in rows], "errors": errors}))
        else:
            for info in rows:
                self.stdout.write(
                    f"{info.alias}\t{info.name}\t{info.host} pid {info.pid} {info.thread}\t"
                    f"{info.context or '-'}\ttoken {info.fencing_token}\texpires {info.expires_at}"
                )
        for failed, why in errors.items():
            self.stderr.write(f"{failed}: {why}")
        if errors:
            raise CommandError("Some aliases could not be listed.", returncode=2)

    def _find(self, alias: str, name: str) -> LockInfo | None:
        self._alias(alias)
        try:
            return find_lock(alias, name)
        except (InvalidLockName, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except LockConfigurationError as exc:
            raise CommandError(f"{alias}: misconfigured: {exc}") from exc
        except DistLockError as exc:
            raise CommandError(f"{alias}: {exc}") from exc

    def do_inspect(self, *, alias: str, name: str, **options: Any) -> None:
        info = self._find(alias, name)
        if info is None:
            raise CommandError(f"{name!r} is not held on {alias!r}.", returncode=3)
        waiting = who_waits(alias, name)
        rows = [waiter_dict(w) for w in waiting.waiters]
        if options["json"]:
            self.stdout.write(json.dumps({
                **_as_dict(info), "waiting": None if waiting.unknown else rows,
                "waiting_unknown": waiting.unknown, "waiting_more": waiting.more,
            }))
            return
        for key, value in _as_dict(info).items():
            self.stdout.write(f"{key}: {value}")
        if waiting.unknown:
            self.stdout.write(f"waiting: unknown ({waiting.unknown})")
        for w in rows:
            waited = "?" if w["waited_s"] is None else f"{w['waited_s']:.1f} s"
            self.stdout.write(
                f"  {w['position']}. owner {w['owner'] or '-'} {w['host'] or '-'} pid "
                f"{w['pid'] or '-'} {w['thread'] or '-'} {w['context'] or ''}\t"
                f"{w['kind'] or '-'}\tsince {w['since'] or '?'} (waiting {waited})"
                f"{' session ' + w['session'] if w['session'] else ''}"
            )
        if waiting.more:
            self.stdout.write(f"  (more than {len(rows)} wait)")

    def do_release(
        self, *, alias: str | None, name: str | None, reason: str | None, yes: bool, **options: Any
    ) -> None:
        if options["host"] or options["owner"] or options["prefix"] or options["pid"] is not None:
            if alias is not None:
                raise CommandError(
                    "Give either ALIAS NAME (one lock) or --host/--owner/--prefix (bulk); "
                    "--alias limits a bulk release to an alias."
                )
            release_bulk(self, reason=reason, yes=yes, **options)
            return
        if alias is None or name is None:
            raise CommandError(
                "Name one lock (ALIAS NAME), or select locks with --host [--pid], --owner "
                "or --prefix."
            )
        if options["aliases"] or options["dry_run"] or options["json"]:
            raise CommandError("--alias, --dry-run and --json go with a bulk release.")
        reason = checked_reason(reason)
        info = self._find(alias, name)
        if info is None:
            raise CommandError(f"{name!r} is not held on {alias!r}.", returncode=3)
        backend = locks[alias]
        if not backend.supports_force_release:
            raise CommandError(f"The alias {alias!r} cannot force-release.")
        if not yes:
            doing = f" ({info.context})" if info.context else ""
            confirm(
                f"Force-release {name!r} on {alias!r}, held by {info.host} pid {info.pid} "
                f"{info.thread}{doing} (token {info.fencing_token})? [y/N] "
            )
        freed = release_audited(name, info, f"command:{getpass.getuser()}", reason)
        self.stdout.write(
            f"Released {name} on {alias}." if freed
            else f"{name} was freed, or taken by another holder, meanwhile; not released."
        )

    def do_prune(self, *, alias: list[str] | None, idle: float, batch: int, **_: Any) -> None:
        failed = False
        for one in alias or list(locks):
            self._alias(one)
            backend = prunable(one)
            if backend is None:
                self.stdout.write(f"{one}: nothing to prune (its keys go when freed)")
                continue
            try:
                deleted = backend.prune(idle_for=idle, batch=batch)
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
            except DistLockError as exc:
                self.stderr.write(f"{one}: {exc}")
                failed = True
                continue
            self.stdout.write(f"{one}: pruned {deleted} idle rows")
        if failed:
            raise CommandError("Some aliases could not be pruned.", returncode=1)

    def do_health(self, **options: Any) -> None:
        results = check_health()
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {h.alias: {"ok": h.ok, "latency_ms": h.latency_ms, "error": h.error}
                     for h in results}
                )
            )
        else:
            for h in results:
                state = f"ok {h.latency_ms:.2f} ms" if h.latency_ms is not None else h.error
                self.stdout.write(f"{h.alias}\t{state}")
        if not all(h.ok for h in results):
            raise CommandError("Some aliases are unavailable.", returncode=1)


def _where(hold: ordering.PastHold) -> str:
    """Where an order was first seen in a record: the later hold's start, holder and
    context."""
    context = f" ({hold.context})" if hold.context else ""
    return f"{hold.start:%Y-%m-%d %H:%M:%S} by {hold.holder}{context}"
