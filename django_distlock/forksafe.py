"""What a forked child must not inherit from its parent, beyond the connections each
backend already drops (see their pid checks)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import SyncToAsync


def _new_thread_sensitive_executor() -> None:
    """asgiref runs thread-sensitive ``sync_to_async`` calls (Django's default, and this
    package's async paths) outside any ``async_to_sync`` on one executor thread, made
    when first used. A forked child inherits the executor but not its thread, and the
    executor, counting that thread as its one worker, starts no other: every such call
    of the child would wait forever. Give the child an executor of its own (no thread
    is started until it is used)."""
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)


os.register_at_fork(after_in_child=_new_thread_sensitive_executor)
