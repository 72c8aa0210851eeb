"""One script run on several hash tags, the calls sent together: :func:`run_each`.

The listing runs its script once per index tag (16 on a Redis Cluster by default). Sent
one after another, a page waited for 16 round trips (about 10 ms); sent as one pipeline
(not a transaction), the calls of each node go out together and a page waits about one
round trip: redis-py's cluster pipeline writes every node's calls before it reads any
reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from .client import Redis
from .errors import CLIENT_ERRORS, REDIS_ERRORS
from .scripts import Script

Call = tuple[tuple[str, ...], tuple[Any, ...]]


def run_each(redis: Redis, script: Script, calls: Sequence[Call]) -> list[Any]:
    """Return ``script``'s reply to each ``(keys, args)`` of ``calls``, in their order: the
    calls sent together (one pipeline; a call whose node lacks the script is run again
    with :meth:`Redis.run`, which loads it).

    :param redis: the alias' clients.
    :param script: the script.
    :param calls: its keys and arguments, per call.
    :returns: the replies.
    :raises BackendUnavailable: when Redis fails.
    """
    if len(calls) == 1:
        return [redis.run(script, *calls[0])]
    try:
        client = redis.sync()
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            # A cluster pipeline asks a node for the keys of each EVALSHA (COMMAND
            # GETKEYS: a round trip per call) unless told where the call goes.
            where = {"target_nodes": client.get_node_from_key(keys[0])} if redis.cluster else {}
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **where)
        replies = pipe.execute(raise_on_error=False)
    except CLIENT_ERRORS as exc:
        raise REDIS_ERRORS.translate(exc) from exc
    for index, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):  # flushed, restarted, failed over
            replies[index] = redis.run(script, *calls[index])
        elif isinstance(reply, CLIENT_ERRORS):
            raise REDIS_ERRORS.translate(reply) from reply
        elif isinstance(reply, BaseException):
            raise reply
    return list(replies)
