"""The parts of ``manage.py distlock release`` shared by the single and the bulk release.

(Its name starts with ``_``: Django does not take it for a command.)
"""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_distlock.exceptions import InvalidLockName
from django_distlock.handler import locks
from django_distlock.values import LockInfo

from ...operations.bulk import Outcome, Preview, Selection, release_selected, select

#: Longest ``--reason``, as the admin's form takes.
MAX_REASON = 2000


def as_dict(info: LockInfo) -> dict[str, Any]:
    """A listed lock as the command's JSON shows it."""
    return {
        "alias": info.alias,
        "name": info.name,
        "owner": info.owner,
        "fencing_token": info.fencing_token,
        "acquired_at": info.acquired_at.isoformat() if info.acquired_at else None,
        "expires_at": info.expires_at.isoformat() if info.expires_at else None,
        "host": info.host,
        "pid": info.pid,
        "thread": info.thread,
        "context": info.context,
        "waiters": info.waiters,
    }


def checked_reason(reason: str | None) -> str:
    """Return ``--reason`` stripped; raise CommandError when it is missing or too long."""
    reason = (reason or "").strip()
    if not reason:
        raise CommandError("--reason must say why (the audit trail records it).")
    if len(reason) > MAX_REASON:
        raise CommandError(f"--reason must be at most {MAX_REASON} characters.")
    return reason


def confirm(question: str) -> None:
    """Ask ``question`` on the terminal; raise CommandError unless the answer is yes (no
    answer on stdin, as when it is not a terminal, is a no)."""
    try:
        answer = input(question)
    except EOFError as exc:
        raise CommandError(
            "Not released: no answer on stdin (not a terminal?); pass --yes to release "
            "without asking.",
            returncode=1,
        ) from exc
    if answer.strip().lower() not in ("y", "yes"):
        raise CommandError("Not released.", returncode=1)


def _line(info: LockInfo) -> str:
    pid = f" pid {info.pid}" if info.pid is not None else ""
    return (
        f"{info.alias}\t{info.name}\t{info.host}{pid} {info.thread}\towner {info.owner}\t"
        f"token {info.fencing_token}"
    )


def _preview(command: BaseCommand, selection: Selection, aliases: list[str] | None) -> Preview:
    for alias in aliases or []:
        if alias not in locks:
            raise CommandError(f"No lock alias {alias!r}; DISTLOCK has {sorted(locks)}.")
    preview = select(selection, aliases)
    for alias, why in preview.skipped_aliases.items():
        if aliases:  # named on the command line: say why nothing is freed there
            command.stderr.write(f"{alias}: left out: {why}")
    return preview


def _end(command: BaseCommand, preview: Preview) -> None:
    if preview.more:
        command.stderr.write("More locks match than one run frees: run it again.")
    for alias, why in preview.errors.items():
        command.stderr.write(f"{alias}: {why}")
    if preview.errors:
        raise CommandError("Some aliases could not be listed.", returncode=2)


def release_bulk(
    command: BaseCommand, *, reason: str | None, yes: bool, **options: Any
) -> None:
    """``distlock release --host H [--pid P] | --owner O | --prefix P``: select, show,
    confirm (unless ``--yes``), free each lock while its listed owner holds it, audit once.

    :raises CommandError: for bad criteria, a refused confirmation, or a failed alias.
    """
    try:
        selection = Selection(
            host=options["host"], pid=options["pid"], owner=options["owner"],
            prefix=options["prefix"],
        )
    except (ValueError, TypeError, InvalidLockName) as exc:
        raise CommandError(str(exc)) from exc
    dry_run, as_json = options["dry_run"], options["json"]
    if not dry_run:
        reason = checked_reason(reason)
        if as_json and not yes:
            raise CommandError("--json releases only with --yes (a question would break it).")
    preview = _preview(command, selection, options["aliases"])
    if dry_run:
        if as_json:
            command.stdout.write(json.dumps({
                "selection": selection.describe(), "dry_run": dry_run,
                "locks": [as_dict(i) for i in preview.locks], "more": preview.more,
                "errors": preview.errors,
            }))
        else:
            for info in preview.locks:
                command.stdout.write(_line(info))
            command.stdout.write(
                f"{len(preview.locks)} lock(s) held match {selection.describe()}; none freed "
                "(--dry-run)."
            )
        _end(command, preview)
        return
    if preview.locks and not yes:
        for info in preview.locks:
            command.stdout.write(_line(info))
        confirm(f"Force-release these {len(preview.locks)} lock(s) ({selection.describe()})? "
                "[y/N] ")
    assert reason is not None  # checked above
    outcome = Outcome()
    if preview.locks:  # an action that frees nothing is not recorded
        outcome = release_selected(
            preview.locks, selection, f"command:{getpass.getuser()}", reason
        )
    if as_json:
        command.stdout.write(json.dumps({
            "selection": selection.describe(), "dry_run": False,
            "freed": [as_dict(i) for i in outcome.freed],
            "skipped": [{**as_dict(i), "why": why} for i, why in outcome.skipped],
            "more": preview.more, "errors": preview.errors,
        }))
    else:
        for info in outcome.freed:
            command.stdout.write(f"released\t{_line(info)}")
        for info, why in outcome.skipped:
            command.stdout.write(f"not released ({why})\t{_line(info)}")
        command.stdout.write(
            f"Released {len(outcome.freed)} lock(s) ({selection.describe()}); "
            f"{len(outcome.skipped)} not released."
        )
    _end(command, preview)
