"""``manage.py distlock_audit purge``: delete old rows of the audit trail (for cron; the
purge itself is recorded)."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...purge import purge


class Command(BaseCommand):
    help = "Purge the audit trail of lock events."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        run = sub.add_parser("purge", help="delete old audit rows (audited; for cron)")
        run.add_argument(
            "--days", type=float, help="older than this (default: each alias' RETENTION_DAYS)"
        )
        run.add_argument(
            "--operator-actions",
            action="store_true",
            help="delete the force releases and purges too (kept otherwise)",
        )

    def handle(self, *args: Any, days: float | None, operator_actions: bool, **_: Any) -> None:
        try:
            deleted = purge(
                days, operator_actions=operator_actions, actor=f"command:{getpass.getuser()}"
            )
        except ValueError as exc:
            raise CommandError(f"--{exc}") from exc
        self.stdout.write(f"Deleted {deleted} audit rows.")
