"""PostgreSQL only: the function lease-mode waiters block in (see backends/_dbsql.py).

Three advisory locks per lock name, all derived in SQL with
``hashtextextended(name, seed)``:

- the queue (seed 0): held by the waiter at the head of the name's queue;
  the other waiters sleep in ``pg_advisory_lock`` behind it, in order;
- a grant's generation (seed = its fencing token): taken with the grant by
  the holder's session and given back by its release, so the release wakes
  the head inside the server, which grants itself at once;
- the settle lock (seed -1): a release or grant that wakes a waiter holds it
  until it commits, so that the waiter reads its result.

The row, not these locks, decides who holds a lock: they only order and wake
the waiters. A head that is not woken looks at the row again when the
holder's lease ends, or after a second (a lease freed by ``force_release()``
or released through another session).
"""

from django.db import migrations

WAIT_FUNCTION = r"""
CREATE OR REPLACE FUNCTION django_distlock_wait(
    p_name text, p_owner text, p_ttl float8, p_host text, p_pid integer, p_thread text,
    p_wait float8
) RETURNS TABLE (
    granted boolean, fencing bigint, acquired_at timestamptz, expires_at timestamptz,
    retry_after float8, generation bigint
) LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    queue CONSTANT bigint := hashtextextended(p_name, 0);
    settle CONSTANT bigint := hashtextextended(p_name, -1);
    until CONSTANT timestamptz := clock_timestamp() + make_interval(secs => p_wait);
    row_wait CONSTANT text := current_setting('lock_timeout');
    cur record;
    won_fencing bigint;
    won_acquired timestamptz;
    won_expires timestamptz;
    t timestamptz;
    budget float8;
    woken bigint;  -- the generation whose lock this call holds, if any
BEGIN
    PERFORM set_config('lock_timeout', CASE WHEN p_wait IS NULL THEN '0'
        ELSE greatest(ceil(p_wait * 1000), 1)::bigint::text || 'ms' END, true);
    BEGIN
        PERFORM pg_advisory_lock(queue);
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
            NULL::float8, NULL::bigint;
        RETURN;
    END;
    LOOP
        -- Wait for the commit of the release or grant that woke us, if any (one
        -- statement: the expressions of a select list run in order).
        PERFORM set_config('lock_timeout', '0', true), pg_advisory_lock_shared(settle),
            pg_advisory_unlock_shared(settle), set_config('lock_timeout', row_wait, true);
        SELECT l.owner, l.fencing, l.expires_at INTO cur
        FROM django_distlock_lock l WHERE l.name = p_name;
        t := clock_timestamp();
        IF NOT FOUND OR cur.owner IS NULL OR cur.expires_at <= t THEN
            IF NOT FOUND THEN  -- the name's first use
                INSERT INTO django_distlock_lock
                    (name, owner, fencing, acquired_at, expires_at, host, pid, thread)
                VALUES (p_name, p_owner, 1, t, t + make_interval(secs => p_ttl),
                    p_host, p_pid, p_thread)
                ON CONFLICT (name) DO NOTHING
                RETURNING 1, t, t + make_interval(secs => p_ttl)
                INTO won_fencing, won_acquired, won_expires;
            ELSE
                -- Blocks only behind an asyncio waiter's grant (the others defer to
                -- the queue), until it commits.
                UPDATE django_distlock_lock l SET owner = p_owner, fencing = l.fencing + 1,
                    acquired_at = t, expires_at = t + make_interval(secs => p_ttl),
                    host = p_host, pid = p_pid, thread = p_thread
                WHERE l.name = p_name AND (l.owner IS NULL OR l.expires_at <= t)
                RETURNING l.fencing, l.acquired_at, l.expires_at
                INTO won_fencing, won_acquired, won_expires;
            END IF;
            IF won_fencing IS NOT NULL THEN
                -- Settle first: the next head reads this grant.
                PERFORM pg_advisory_xact_lock(settle),
                    pg_advisory_unlock(hashtextextended(p_name, woken)), pg_advisory_unlock(queue);
                RETURN QUERY SELECT true, won_fencing, won_acquired, won_expires,
                    NULL::float8, CASE WHEN pg_try_advisory_lock(
                        hashtextextended(p_name, won_fencing)) THEN won_fencing END;
                RETURN;
            END IF;
            CONTINUE;
        END IF;
        budget := extract(epoch FROM cur.expires_at - t);
        IF p_wait IS NOT NULL THEN
            budget := least(budget, extract(epoch FROM until - t));
        END IF;
        IF budget <= 0 THEN
            IF woken IS NOT NULL THEN
                PERFORM pg_advisory_unlock(hashtextextended(p_name, woken));
            END IF;
            PERFORM pg_advisory_unlock(queue);
            RETURN QUERY SELECT false, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
                extract(epoch FROM cur.expires_at - t)::float8, NULL::bigint;
            RETURN;
        END IF;
        IF woken = cur.fencing THEN
            -- This grant's lock came to us, its lease did not: its session ended
            -- without a release. Keep the head of the queue until the lease ends.
            PERFORM pg_sleep(least(budget, 1.0));
            CONTINUE;
        END IF;
        IF woken IS NOT NULL THEN
            PERFORM pg_advisory_unlock(hashtextextended(p_name, woken));
            woken := NULL;
        END IF;
        PERFORM set_config('lock_timeout',
            greatest(ceil(least(budget, 1.0) * 1000), 1)::bigint::text || 'ms', true);
        BEGIN
            PERFORM pg_advisory_lock(hashtextextended(p_name, cur.fencing));
            woken := cur.fencing;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            NULL;  -- the lease ended, or a second passed: look again
        END;
    END LOOP;
END
$fn$
"""

DROP_WAIT_FUNCTION = (
    "DROP FUNCTION IF EXISTS django_distlock_wait(text, text, float8, text, integer, text, float8)"
)


def create_wait_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(WAIT_FUNCTION)


def drop_wait_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_WAIT_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("django_distlock", "0001_initial")]

    operations = [
        migrations.RunPython(create_wait_function, drop_wait_function, elidable=False),
    ]
