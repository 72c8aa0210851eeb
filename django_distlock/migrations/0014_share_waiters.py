"""PostgreSQL: who waits in a name's kinds queue (read and write locks, semaphores).

A thread about to sleep in the queue (``django_distlock_share_join``) first writes one
row here, keyed by its server session: the kind it waits for, since when, and its
owner id, host, process and thread (backends/database/waiting.py shows them). The row
is shown only while that session waits in, or heads, that name's queue, so a row left
by a waiter that was granted, gave up or died shows nothing; the session's next
enqueue replaces it, and an enqueue clears the rows of dead sessions for its name.
"""

from django.db import migrations

TABLE = """
CREATE TABLE IF NOT EXISTS django_distlock_share_waiter (
    session integer PRIMARY KEY,
    started timestamptz NOT NULL,
    name text NOT NULL,
    kind text NOT NULL,
    since timestamptz NOT NULL,
    owner text NOT NULL,
    host text NOT NULL,
    pid integer,
    thread text NOT NULL
);
CREATE INDEX IF NOT EXISTS distlock_share_waiter_name_idx
    ON django_distlock_share_waiter (name);
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TABLE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TABLE IF EXISTS django_distlock_share_waiter", params=None)


class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0013_held_age_indexes")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
