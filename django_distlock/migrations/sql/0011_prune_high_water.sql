-- Migration 0011 (PostgreSQL): a lock row may be pruned (deleted when idle, see
-- django_distlock/backends/database/prune.py and docs/database.md), so a name's row may
-- be made anew. Its fencing tokens must still grow: a new row starts above the highest
-- token of every pruned row, which the prune keeps in a reserved row (a name no lock can
-- have: it starts with a control character). A fixed copy.
--
-- The race it closes: an INSERT whose conflicting row a prune is deleting waits for the
-- prune to commit, then inserts; a token it computed before that wait would repeat one.
-- So every insert takes the prune's advisory lock, shared (a prune holds it exclusive
-- while it deletes, and only tries for it: it never makes an insert wait behind it), and
-- reads the high-water mark after: with a prune in progress, after its commit.
CREATE OR REPLACE FUNCTION django_distlock_first_token() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    high bigint;
BEGIN
    IF NEW.name = E'\x1edistlock:high-water' THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1684632436, 11);
    SELECT l.fencing INTO high FROM django_distlock_lock l
    WHERE l.name = E'\x1edistlock:high-water';
    NEW.fencing := NEW.fencing + coalesce(high, 0);
    RETURN NEW;
END
$fn$;

DROP TRIGGER IF EXISTS django_distlock_first_token ON django_distlock_lock;
CREATE TRIGGER django_distlock_first_token BEFORE INSERT ON django_distlock_lock
FOR EACH ROW EXECUTE FUNCTION django_distlock_first_token();

-- 0009's wait, but a name's first grant returns the token its new row has (it was 1:
-- with the trigger above, a row made anew after a prune starts higher).
CREATE OR REPLACE PROCEDURE django_distlock_wait(
    p_name text, p_owner text, p_ttl float8, p_host text, p_pid integer, p_thread text,
    p_wait float8,
    INOUT granted boolean DEFAULT NULL, INOUT fencing bigint DEFAULT NULL,
    INOUT acquired_at timestamptz DEFAULT NULL, INOUT expires_at timestamptz DEFAULT NULL,
    INOUT retry_after float8 DEFAULT NULL, INOUT generation bigint DEFAULT NULL
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    queue CONSTANT bigint := hashtextextended(p_name, 0);
    alive CONSTANT bigint := hashtextextended(p_owner, -2);
    until CONSTANT timestamptz := clock_timestamp() + make_interval(secs => p_wait);
    row_wait CONSTANT text := current_setting('lock_timeout');
    cur record;
    t timestamptz;
    free_at timestamptz;  -- when the holder's lease, or another waiter's reservation, ends
    budget float8;
    woken bigint;  -- the generation whose lock this call holds, if any
    leaving boolean := false;  -- out of time: our reservation is withdrawn
    known boolean;  -- the name has a row
    started CONSTANT timestamptz := clock_timestamp();
    belled bigint;  -- the row's fencing when this call last got the shares' bell
BEGIN
    granted := false;
    PERFORM set_config('lock_timeout', CASE WHEN p_wait IS NULL THEN '0'
        ELSE greatest(ceil(p_wait * 1000), 1)::bigint::text || 'ms' END, true);
    BEGIN
        PERFORM pg_advisory_lock(queue);
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        -- A lock granted just as its wait times out is kept by the server (and a
        -- session-level one outlives the error): give it back if so.
        PERFORM django_distlock_unlock_if_held(queue);
        RETURN;
    END;
    PERFORM pg_advisory_lock(alive);
    LOOP
        PERFORM set_config('lock_timeout', row_wait, true);
        SELECT l.owner, l.fencing, l.acquired_at, l.expires_at, l.next_owner,
            l.expires_at + make_interval(secs => l.next_ttl) AS reserved_until,
            CASE WHEN l.next_owner <> p_owner
                THEN django_distlock_orphaned(l.next_owner, l.next_epoch) END AS orphaned
        INTO cur FROM django_distlock_lock l WHERE l.name = p_name;
        known := FOUND;
        t := clock_timestamp();
        IF cur.owner = p_owner THEN
            -- Handed over by the release that woke us: nothing to write.
            granted := true;
            fencing := cur.fencing;
            acquired_at := cur.acquired_at;
            expires_at := cur.expires_at;
            EXIT;
        END IF;
        free_at := CASE WHEN cur.owner IS NOT NULL THEN cur.expires_at END;
        IF cur.next_owner <> p_owner AND NOT cur.orphaned THEN
            free_at := greatest(free_at, cur.reserved_until);
        END IF;
        IF NOT known OR free_at IS NULL OR free_at <= t THEN
            IF NOT known THEN  -- the name's first use
                INSERT INTO django_distlock_lock
                    (name, owner, fencing, acquired_at, expires_at, host, pid, thread)
                VALUES (p_name, p_owner, 1, t, t + make_interval(secs => p_ttl),
                    p_host, p_pid, p_thread)
                ON CONFLICT (name) DO NOTHING
                RETURNING django_distlock_lock.fencing, t, t + make_interval(secs => p_ttl)
                INTO fencing, acquired_at, expires_at;
            ELSE
                -- Over another waiter's reservation, skip a fencing number: a handover
                -- to it may have been issued and lost with a crash. Blocks only behind
                -- an asyncio waiter's grant (the others defer to the queue), until it
                -- commits.
                UPDATE django_distlock_lock l SET owner = p_owner,
                    fencing = l.fencing + 1 + (l.next_owner IS NOT NULL
                        AND l.next_owner <> p_owner)::int,
                    acquired_at = t, expires_at = t + make_interval(secs => p_ttl),
                    host = p_host, pid = p_pid, thread = p_thread, next_owner = NULL
                WHERE l.name = p_name AND (l.owner IS NULL OR l.expires_at <= t)
                    AND (l.next_owner IS NULL OR l.next_owner = p_owner
                        OR l.expires_at + make_interval(secs => l.next_ttl) <= t
                        OR django_distlock_orphaned(l.next_owner, l.next_epoch))
                RETURNING l.fencing, l.acquired_at, l.expires_at
                INTO fencing, acquired_at, expires_at;
            END IF;
            IF fencing IS NOT NULL THEN
                COMMIT;  -- before the next head, woken below, reads the row
                granted := true;
                EXIT;
            END IF;
            CONTINUE;
        END IF;
        budget := extract(epoch FROM free_at - t);
        IF p_wait IS NOT NULL THEN
            budget := least(budget, extract(epoch FROM until - t));
        END IF;
        IF budget > 0 AND (cur.next_owner IS NULL OR cur.orphaned) AND NOT leaving THEN
            -- Reserve the lock, durably, while its holder holds it (docs/database.md),
            -- in place of a reservation whose head is gone.
            UPDATE django_distlock_lock l SET next_owner = p_owner, next_ttl = p_ttl,
                next_host = p_host, next_pid = p_pid, next_thread = p_thread,
                next_epoch = django_distlock_epoch()
            WHERE l.name = p_name AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
                AND (l.next_owner IS NULL OR l.next_owner = cur.next_owner);
            COMMIT;
            CONTINUE;
        END IF;
        IF budget <= 0 THEN
            IF cur.next_owner = p_owner AND NOT leaving THEN
                -- Withdraw the reservation (the row lock orders this against a
                -- handover), then look once more: one may have come.
                PERFORM set_config('synchronous_commit', 'off', true);
                UPDATE django_distlock_lock l SET next_owner = NULL
                WHERE l.name = p_name AND l.next_owner = p_owner;
                leaving := true;
                CONTINUE;
            END IF;
            COMMIT;  -- the withdrawal, if any, before the next head looks
            retry_after := extract(epoch FROM free_at - t);
            EXIT;
        END IF;
        IF cur.owner IN ('~read', '~semaphore') THEN
            -- Held by readers or permits: the session of each holds the name's bell in
            -- shared mode, and gives it back after its release commits; the last one
            -- lets this wait through (our reservation keeps new shares out).
            IF belled = cur.fencing THEN
                -- The bell came, the shares did not go: a holder's session ended
                -- without a release (its share ends at its TTL). Look again in a while.
                PERFORM pg_sleep(least(budget, 1.0));
                CONTINUE;
            END IF;
            PERFORM set_config('lock_timeout',
                greatest(ceil(least(budget, 1.0) * 1000), 1)::bigint::text || 'ms', true);
            BEGIN
                PERFORM pg_advisory_lock(hashtextextended(p_name, -4)),
                    pg_advisory_unlock(hashtextextended(p_name, -4));
                belled := cur.fencing;
            EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                PERFORM django_distlock_unlock_if_held(hashtextextended(p_name, -4));
            END;
            CONTINUE;
        END IF;
        IF woken = cur.fencing THEN
            -- This grant's lock came to us, its lease did not: its session ended
            -- without a release (or the lock waits for another's reservation). Keep
            -- the head of the queue until then.
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
            -- The lease ended, or a second passed: look again (giving back the lock
            -- if it was granted as the wait timed out, as above).
            PERFORM django_distlock_unlock_if_held(hashtextextended(p_name, cur.fencing));
        END;
    END LOOP;
    IF granted THEN
        -- On a grant, retry_after carries the seconds between this call's start and
        -- the grant, on the server's clock: the client counts the lease's validity
        -- from its sending of the call plus this, not from the call's start.
        retry_after := greatest(extract(epoch FROM acquired_at - started), 0);
        -- The grant's generation lock, before the next head can look for it.
        generation := CASE WHEN pg_try_advisory_lock(hashtextextended(p_name, fencing))
            THEN fencing END;
    END IF;
    PERFORM pg_advisory_unlock(hashtextextended(p_name, woken)),
        pg_advisory_unlock(alive), pg_advisory_unlock(queue);
END
$fn$;
