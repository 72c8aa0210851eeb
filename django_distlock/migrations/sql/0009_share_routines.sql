-- Migration 0009 (PostgreSQL): lease mode's read-write locks and semaphores, one call
-- per grant, release, extend, force release, joining and leaving the queue (each was
-- a transaction of four to six statements), and the wake-up of the head of a name's
-- queue of readers, writers and permits by the release that frees the name: the head
-- listens on the name's channel, a release that sees a head notifies it. The
-- exclusive release, redefined, wakes that head too. A fixed copy; see
-- docs/database.md ("Read-write locks and semaphores").

-- Wake the head of the name's queue of readers, writers and permits, if one waits: it
-- holds the queue's advisory lock and listens on the name's channel. Looked at with a
-- shared session lock of the queue given back at once (a first attempt that tries the
-- queue meanwhile misses, as when two attempts try it at once).
CREATE OR REPLACE FUNCTION django_distlock_share_wake(p_name text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    IF pg_try_advisory_lock_shared(hashtextextended(p_name, -3)) THEN
        PERFORM pg_advisory_unlock_shared(hashtextextended(p_name, -3));
    ELSE
        PERFORM pg_notify('django_distlock_' || md5(p_name), '');
    END IF;
END
$fn$;

-- The name's row shows its live shares again: the latest end of them, owner NULL when
-- none is left (the row's lock is held).
CREATE OR REPLACE FUNCTION django_distlock_share_recompute(p_name text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    last_end timestamptz;
BEGIN
    SELECT max(s.expires_at) INTO last_end FROM django_distlock_share s
    WHERE s.name = p_name AND s.expires_at > p_now;
    UPDATE django_distlock_lock l SET expires_at = coalesce(last_end, l.expires_at),
        owner = CASE WHEN last_end IS NOT NULL THEN l.owner END
    WHERE l.name = p_name AND l.owner IN ('~read', '~semaphore');
END
$fn$;

-- Join the name's queue: wait (at most p_wait seconds) for its advisory lock, then
-- listen on its channel. False when the wait timed out.
CREATE OR REPLACE FUNCTION django_distlock_share_join(p_name text, p_wait float8)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('lock_timeout',
        greatest(ceil(p_wait * 1000), 1)::bigint::text || 'ms', true);
    BEGIN
        PERFORM pg_advisory_lock(hashtextextended(p_name, -3));
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        -- A lock granted just as its wait timed out is kept (session-level): give it back.
        PERFORM django_distlock_unlock_if_held(hashtextextended(p_name, -3));
        RETURN false;
    END;
    EXECUTE 'LISTEN ' || quote_ident('django_distlock_' || md5(p_name));
    RETURN true;
END
$fn$;

-- Leave the name's queue (if p_queued) and withdraw a waiting writer's mark (if
-- p_owner, the writer's owner); a withdrawn mark wakes the next head.
CREATE OR REPLACE FUNCTION django_distlock_share_leave(
    p_name text, p_queued boolean, p_owner text
) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    dropped boolean := false;
BEGIN
    IF p_owner IS NOT NULL THEN
        UPDATE django_distlock_lock l SET intent_owner = NULL, intent_until = NULL
        WHERE l.name = p_name AND l.intent_owner = p_owner;
        dropped := FOUND;
    END IF;
    IF p_queued THEN
        EXECUTE 'UNLISTEN ' || quote_ident('django_distlock_' || md5(p_name));
        PERFORM django_distlock_unlock_if_held(hashtextextended(p_name, -3));
    END IF;
    IF dropped THEN
        PERFORM django_distlock_share_wake(p_name);
    END IF;
END
$fn$;

-- One attempt of a reader (p_kind 'read'), a permit ('semaphore', p_limit) or a writer
-- ('write', p_owner with ':w'). The first statement locks the name's row (created if
-- new): every statement after it sees the shares committed before (each statement of
-- a function takes a new snapshot), and no other grant of the name runs until this
-- call commits, so the count of live shares is exact. p_pass: the caller may pass the
-- name's queue (its head, or an asyncio task: a first attempt does not pass it);
-- p_head: the caller heads the queue, and leaves it with a grant. p_mark: a writer
-- that will wait marks the row (keeps new readers out).
-- On a grant: r_granted, r_fencing, r_acquired_at, r_expires_at, and for a writer
-- r_generation (the grant's generation lock, taken as an exclusive grant takes it:
-- its release wakes a lock() waiter). On a miss: r_retry_after (seconds until the
-- name may free, NULL if unknown) and r_stored (a semaphore's stored limit when it is
-- not p_limit).
CREATE OR REPLACE FUNCTION django_distlock_share_grant(
    p_name text, p_owner text, p_kind text, p_ttl float8, p_limit integer, p_host text,
    p_pid integer, p_thread text, p_pass boolean, p_head boolean, p_mark boolean,
    OUT r_granted boolean, OUT r_fencing bigint, OUT r_acquired_at timestamptz,
    OUT r_expires_at timestamptz, OUT r_retry_after float8, OUT r_stored integer,
    OUT r_generation bigint
) LANGUAGE plpgsql AS $fn$
DECLARE
    sentinel CONSTANT text := CASE p_kind WHEN 'read' THEN '~read'
        WHEN 'semaphore' THEN '~semaphore' END;
    cur record;
    t timestamptz;
    later timestamptz;
    live integer;
    mine boolean;
    next_end timestamptz;
    free boolean;
    ok boolean;
BEGIN
    r_granted := false;
    INSERT INTO django_distlock_lock AS l (name, fencing, host, thread)
    VALUES (p_name, 0, '', '')
    ON CONFLICT (name) DO UPDATE SET fencing = l.fencing WHERE false;
    t := clock_timestamp();
    later := t + make_interval(secs => p_ttl);
    SELECT l.owner, l.expires_at, l.intent_owner, l.intent_until, l.share_limit,
        coalesce(l.next_owner IS NOT NULL
            AND l.expires_at + make_interval(secs => l.next_ttl) > t
            AND NOT django_distlock_orphaned(l.next_owner, l.next_epoch), false) AS reserved,
        l.expires_at + make_interval(secs => l.next_ttl) AS reserved_until
    INTO cur FROM django_distlock_lock l WHERE l.name = p_name;
    SELECT count(*), coalesce(bool_or(s.owner = p_owner), false), min(s.expires_at)
    INTO live, mine, next_end
    FROM django_distlock_share s WHERE s.name = p_name AND s.expires_at > t;
    free := cur.owner IS NULL OR cur.expires_at <= t;
    IF sentinel IS NOT NULL THEN
        ok := (free OR cur.owner = sentinel) AND NOT cur.reserved AND CASE
            WHEN p_limit IS NULL THEN cur.intent_owner IS NULL OR cur.intent_until <= t
            ELSE (free OR cur.share_limit = p_limit) AND live < p_limit END;
    ELSE
        ok := (free OR cur.owner = p_owner) AND NOT cur.reserved AND live = 0
            AND (cur.intent_owner IS NULL OR cur.intent_owner = p_owner
                OR cur.intent_until <= t);
    END IF;
    IF ok AND NOT p_pass THEN  -- no passing the waiters queued in the server
        ok := pg_try_advisory_xact_lock(hashtextextended(p_name, -3));
    END IF;
    IF ok OR mine THEN  -- mine: an attempt retried after a lost connection
        IF sentinel IS NOT NULL THEN
            UPDATE django_distlock_lock l SET owner = sentinel, fencing = l.fencing + 1,
                acquired_at = t,
                expires_at = CASE WHEN l.owner = sentinel AND l.expires_at > later
                    THEN l.expires_at ELSE later END,
                host = p_host, pid = p_pid, thread = p_thread,
                share_limit = coalesce(p_limit, l.share_limit)
            WHERE l.name = p_name RETURNING l.fencing INTO r_fencing;
            INSERT INTO django_distlock_share AS s
                (name, owner, kind, fencing, acquired_at, expires_at, host, pid, thread)
            VALUES (p_name, p_owner, p_kind, r_fencing, t, later, p_host, p_pid, p_thread)
            ON CONFLICT (name, owner) DO UPDATE SET fencing = excluded.fencing,
                acquired_at = excluded.acquired_at, expires_at = excluded.expires_at;
        ELSE
            -- Over an exclusive waiter's reservation, skip a fencing number (as the
            -- exclusive grant does: a handover to it may have been issued and lost).
            UPDATE django_distlock_lock l SET owner = p_owner,
                fencing = l.fencing + 1 + (l.next_owner IS NOT NULL)::int,
                acquired_at = t, expires_at = later,
                host = p_host, pid = p_pid, thread = p_thread, next_owner = NULL,
                intent_owner = CASE WHEN l.intent_owner = p_owner THEN NULL
                    ELSE l.intent_owner END
            WHERE l.name = p_name RETURNING l.fencing INTO r_fencing;
            r_generation := CASE WHEN pg_try_advisory_lock(hashtextextended(p_name, r_fencing))
                THEN r_fencing END;
        END IF;
        r_granted := true;
        r_acquired_at := t;
        r_expires_at := later;
        IF p_head THEN  -- the next waiter heads the queue (it reads after this commits)
            EXECUTE 'UNLISTEN ' || quote_ident('django_distlock_' || md5(p_name));
            PERFORM django_distlock_unlock_if_held(hashtextextended(p_name, -3));
        END IF;
        RETURN;
    END IF;
    r_stored := CASE WHEN cur.owner = '~semaphore' AND cur.expires_at > t
        AND cur.share_limit <> p_limit THEN cur.share_limit END;
    r_retry_after := extract(epoch FROM least(
        coalesce(next_end, CASE WHEN NOT free THEN cur.expires_at END),
        CASE WHEN cur.reserved THEN cur.reserved_until END,
        CASE WHEN cur.intent_until > t AND cur.intent_owner <> p_owner
            THEN cur.intent_until END) - t);
    IF p_mark AND sentinel IS NULL AND r_stored IS NULL THEN
        UPDATE django_distlock_lock l SET intent_owner = p_owner,
            intent_until = t + interval '2 seconds'
        WHERE l.name = p_name AND (l.intent_owner IS NULL OR l.intent_owner = p_owner
            OR l.intent_until <= t);
    END IF;
END
$fn$;

-- Release a reader or a permit (and forget the name's expired shares); wake the head.
-- True when the share was still live.
CREATE OR REPLACE FUNCTION django_distlock_share_release(p_name text, p_owner text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    valid boolean;
    gone integer;
BEGIN
    -- Losing this commit in a crash only keeps the share until its TTL.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM django_distlock_lock l WHERE l.name = p_name FOR UPDATE;
    t := clock_timestamp();
    WITH d AS (
        DELETE FROM django_distlock_share s
        WHERE s.name = p_name AND (s.owner = p_owner OR s.expires_at <= t)
        RETURNING s.owner = p_owner AND s.expires_at > t AS v
    ) SELECT coalesce(bool_or(v), false), count(*) INTO valid, gone FROM d;
    IF gone > 0 THEN
        PERFORM django_distlock_share_recompute(p_name, t);
        PERFORM django_distlock_share_wake(p_name);
    END IF;
    RETURN valid;
END
$fn$;

-- Extend a reader or a permit by p_ttl from now, if still live.
CREATE OR REPLACE FUNCTION django_distlock_share_extend(
    p_name text, p_owner text, p_ttl float8,
    OUT r_fencing bigint, OUT r_acquired_at timestamptz, OUT r_expires_at timestamptz
) LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
BEGIN
    PERFORM 1 FROM django_distlock_lock l WHERE l.name = p_name FOR UPDATE;
    t := clock_timestamp();
    UPDATE django_distlock_share s SET expires_at = t + make_interval(secs => p_ttl)
    WHERE s.name = p_name AND s.owner = p_owner AND s.expires_at > t
    RETURNING s.fencing, s.acquired_at, s.expires_at
    INTO r_fencing, r_acquired_at, r_expires_at;
    IF FOUND THEN
        PERFORM django_distlock_share_recompute(p_name, t);
    END IF;
END
$fn$;

-- Force release: the shares whose owner starts with p_expected ('' : all), and the
-- row's holder (an exclusive holder or a writer whose id matches, or the readers or
-- permits as a whole when p_expected is ''). True when anything held was freed.
CREATE OR REPLACE FUNCTION django_distlock_share_force(p_name text, p_expected text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    shares integer;
    held boolean;
BEGIN
    PERFORM 1 FROM django_distlock_lock l WHERE l.name = p_name FOR UPDATE;
    t := clock_timestamp();
    WITH d AS (
        DELETE FROM django_distlock_share s WHERE s.name = p_name AND s.expires_at > t
            AND substr(s.owner, 1, length(p_expected)) = p_expected
        RETURNING 1
    ) SELECT count(*) INTO shares FROM d;
    UPDATE django_distlock_lock l SET owner = NULL, next_owner = NULL
    WHERE l.name = p_name AND l.owner IS NOT NULL AND l.expires_at > t
        AND substr(l.owner, 1, length(p_expected)) = p_expected;
    held := FOUND;
    PERFORM django_distlock_share_recompute(p_name, t);
    IF held OR shares > 0 THEN
        PERFORM django_distlock_share_wake(p_name);
    END IF;
    RETURN held OR shares > 0;
END
$fn$;

-- The exclusive (and writer's) release of 0003, which now also wakes the head of the
-- name's queue of readers, writers and permits.
CREATE OR REPLACE PROCEDURE django_distlock_release(
    p_name text, p_owner text, p_generation bigint, INOUT valid boolean DEFAULT NULL
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
BEGIN
    -- Hand over to a live reserved head (its session holds its own advisory lock),
    -- else clear the reservation; keep a live one when this lease had already ended.
    -- No wait for the WAL flush: see the module.
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE django_distlock_lock l SET (owner, fencing, acquired_at, expires_at, host, pid,
        thread, next_owner) = (
        SELECT CASE WHEN over THEN l.next_owner END, l.fencing + over::int,
            CASE WHEN over THEN now() ELSE l.acquired_at END,
            CASE WHEN over THEN now() + make_interval(secs => l.next_ttl) ELSE l.expires_at END,
            CASE WHEN over THEN l.next_host ELSE l.host END,
            CASE WHEN over THEN l.next_pid ELSE l.pid END,
            CASE WHEN over THEN l.next_thread ELSE l.thread END,
            CASE WHEN live AND NOT over THEN l.next_owner END
        FROM (SELECT live, live AND l.expires_at > now() AS over FROM (
            SELECT l.next_owner IS NOT NULL
                AND NOT pg_try_advisory_xact_lock(hashtextextended(l.next_owner, -2)) AS live
        ) a) b)
    WHERE l.name = p_name AND l.owner = p_owner
    RETURNING l.expires_at > now() INTO valid;
    IF valid IS NOT NULL THEN
        PERFORM django_distlock_share_wake(p_name);
    END IF;
    COMMIT;
    -- Wakes the head, which reads the row committed. Given back even when the
    -- lease was lost.
    PERFORM pg_advisory_unlock(hashtextextended(p_name, p_generation));
END
$fn$;
