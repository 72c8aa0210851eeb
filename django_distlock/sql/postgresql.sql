-- The PostgreSQL part of the database backend: what the core's migration installs
-- (django_distlock/migrations/0001_squashed_0014_share_waiters.py) on PostgreSQL, the
-- live text of every routine. SQLite needs none of it: its statements are in
-- backends/database/sql.py and shares_sql.py. The design is in docs/database.md.
--
-- Every statement can run again (IF NOT EXISTS, CREATE OR REPLACE): after a release, a
-- change here ships with a new migration that runs this file again
-- (CONTRIBUTING.md, "The PostgreSQL routines"). tests/test_plpgsql.py checks that what
-- a migrated database runs is this text.
--
-- What several routines do is written once, in a helper: a bounded wait for an advisory
-- lock, the test of a reservation, the name of a queue's channel. A helper on the path
-- of an uncontended grant or release is a SQL function, which the planner inlines: a
-- PL/pgSQL call there would cost server time on every lock.
--
-- The name's two queues stay two. lock() waiters queue on (name, 0): their head reserves
-- the row, and the release hands the row over to it and wakes it through the grant's
-- generation lock, with no round trip between the release and the grant. Readers,
-- writers and permits queue on (name, -3): a NOTIFY wakes their head, which attempts
-- again, since a share's grant counts the live shares under the row lock, and readers
-- are let in several at once, which a handover of the row to one head cannot do (and
-- asyncio tasks poll, passing the queue). They meet in the row: a reservation keeps
-- shares out, live shares keep a lock() waiter behind their bell. One queue for both
-- would change a hand-off or a grant, not just the text (issue 33's plan, D.5, phase 2).

-- Listing pages through names in byte order ("C" collation), whatever the database's
-- collation, so a prefix is one contiguous range.
CREATE INDEX IF NOT EXISTS distlock_held_c_idx ON django_distlock_lock
    ((name COLLATE "C")) WHERE owner IS NOT NULL;
CREATE INDEX IF NOT EXISTS distlock_name_c_idx ON django_distlock_lock ((name COLLATE "C"));

-- A reservation whose head's session is gone is not honoured, unless the server crashed
-- since it was made (a handover to it may then have been lost with the crash). This
-- UNLOGGED table holds the server's epoch: the server empties it in crash recovery (not
-- at a clean shutdown), so a reservation stamped with the current epoch was made since
-- the last crash.
CREATE UNLOGGED TABLE IF NOT EXISTS django_distlock_epoch (
    id integer PRIMARY KEY, epoch bigint NOT NULL
);

-- Transaction mode's fencing tokens come from a sequence, whose numbers are never given
-- twice, even by a grant whose transaction rolled back or whose session died. It starts
-- above every token the lock table holds.
CREATE SEQUENCE IF NOT EXISTS django_distlock_fencing AS bigint;
SELECT setval('django_distlock_fencing',
    GREATEST(1, (SELECT coalesce(max(fencing), 0) FROM django_distlock_lock)), true);

-- Who waits in a name's kinds queue (read and write locks, semaphores). A thread about
-- to sleep in the queue (django_distlock_share_join) first writes one row here, keyed by
-- its server session: the kind it waits for, since when, and its owner id, host, process
-- and thread (backends/database/waiting.py shows them). The row is shown only while that
-- session waits in, or heads, that name's queue; the session's next enqueue replaces it,
-- and an enqueue clears the rows of dead sessions for its name.
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

-- The current epoch, made anew after a crash emptied the table.
CREATE OR REPLACE FUNCTION django_distlock_epoch() RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    e bigint;
BEGIN
    SELECT t.epoch INTO e FROM django_distlock_epoch t WHERE t.id = 1;
    IF e IS NULL THEN
        INSERT INTO django_distlock_epoch VALUES (1, (random() * 9e18)::bigint)
        ON CONFLICT (id) DO NOTHING;
        SELECT t.epoch INTO e FROM django_distlock_epoch t WHERE t.id = 1;
    END IF;
    RETURN e;
END
$fn$;

-- Whether a reservation (its head's owner token and epoch) is orphaned: made since
-- the last crash, and its head's session is gone (its alive lock is free; looked at
-- with a session lock given back at once, so no release mistakes us for the head).
CREATE OR REPLACE FUNCTION django_distlock_orphaned(p_owner text, p_epoch bigint)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_owner IS NULL OR p_epoch IS DISTINCT FROM
            (SELECT t.epoch FROM django_distlock_epoch t WHERE t.id = 1) THEN
        RETURN false;
    END IF;
    IF pg_try_advisory_lock(hashtextextended(p_owner, -2)) THEN
        PERFORM pg_advisory_unlock(hashtextextended(p_owner, -2));
        RETURN true;
    END IF;
    RETURN false;
END
$fn$;

-- Give back a session-level advisory lock if this session holds it (an unlock of a
-- lock not held would log a warning).
CREATE OR REPLACE FUNCTION django_distlock_unlock_if_held(p_key bigint)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
            AND pid = pg_backend_pid() AND granted
            AND classid::bigint = (p_key >> 32) & 4294967295
            AND objid::bigint = p_key & 4294967295) THEN
        PERFORM pg_advisory_unlock(p_key);
    END IF;
END
$fn$;

-- Wait at most p_secs seconds (NULL: no limit) for a session-level advisory lock; false
-- when the wait timed out (or would deadlock). The transaction's lock_timeout stays the
-- wait's.
CREATE OR REPLACE FUNCTION django_distlock_lock_within(p_key bigint, p_secs float8)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('lock_timeout', CASE WHEN p_secs IS NULL THEN '0'
        ELSE greatest(ceil(p_secs * 1000), 1)::bigint::text || 'ms' END, true);
    BEGIN
        PERFORM pg_advisory_lock(p_key);
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        -- A lock granted just as its wait timed out is kept by the server (and a
        -- session-level one outlives the error): give it back if so.
        PERFORM django_distlock_unlock_if_held(p_key);
        RETURN false;
    END;
    RETURN true;
END
$fn$;

-- Whether a reservation (the row's next_owner, next_epoch, expires_at and next_ttl)
-- keeps the lock at p_at: it has not ended, and its head is alive or the server crashed
-- since it was made. SQL, so that the planner inlines it (no call on a grant's path).
CREATE OR REPLACE FUNCTION django_distlock_reserved(
    p_owner text, p_epoch bigint, p_expires timestamptz, p_ttl float8, p_at timestamptz
) RETURNS boolean LANGUAGE sql AS $fn$
SELECT p_owner IS NOT NULL AND p_expires + make_interval(secs => p_ttl) > p_at
    AND NOT django_distlock_orphaned(p_owner, p_epoch)
$fn$;

-- The channel the head of a name's kinds queue listens on (shares_sql.pg_channel() in
-- Python). SQL and IMMUTABLE: inlined, and folded where the name is a constant.
CREATE OR REPLACE FUNCTION django_distlock_channel(p_name text)
RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
SELECT 'django_distlock_' || md5(p_name)
$fn$;

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
        PERFORM pg_notify(django_distlock_channel(p_name), '');
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

-- Join the name's queue: wait (at most p_wait seconds; NULL: 1 ms) for its advisory
-- lock, then listen on its channel. False when the wait timed out.
CREATE OR REPLACE FUNCTION django_distlock_share_join(p_name text, p_wait float8)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT django_distlock_lock_within(hashtextextended(p_name, -3), coalesce(p_wait, 0)) THEN
        RETURN false;
    END IF;
    EXECUTE 'LISTEN ' || quote_ident(django_distlock_channel(p_name));
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
        EXECUTE 'UNLISTEN ' || quote_ident(django_distlock_channel(p_name));
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
        coalesce(django_distlock_reserved(l.next_owner, l.next_epoch, l.expires_at,
            l.next_ttl, t), false) AS reserved,
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
    IF (ok OR mine) AND sentinel IS NOT NULL THEN
        -- A share's session holds the name's bell (shared) until its release: a lock()
        -- waiter behind the shares waits for it (and, waiting, keeps new shares out).
        ok := pg_try_advisory_lock_shared(hashtextextended(p_name, -4));
        mine := mine AND ok;
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
            PERFORM django_distlock_share_leave(p_name, true, NULL);
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
-- valid: whether the share was still live. p_bell: this session holds the share's bell,
-- given back after the commit (a lock() waiter then reads the shares gone).
CREATE OR REPLACE PROCEDURE django_distlock_share_release(
    p_name text, p_owner text, p_bell boolean, INOUT valid boolean DEFAULT NULL
) LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    t timestamptz;
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
    COMMIT;
    IF p_bell THEN
        PERFORM pg_advisory_unlock_shared(hashtextextended(p_name, -4));
    END IF;
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

-- The exclusive (and writer's) release: frees the name or hands it to the reserved head
-- of its queue, and wakes the head of the name's queue of readers, writers and permits.
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

-- A lock row may be pruned (deleted when idle, see
-- django_distlock/backends/database/prune.py and docs/database.md), so a name's row may
-- be made anew. Its fencing tokens must still grow: a new row starts above the highest
-- token of every pruned row, which the prune keeps in a reserved row (a name no lock can
-- have: it starts with a control character).
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

-- The exclusive lease wait: grant at once, or queue in the server (the name's advisory
-- lock), reserve the row for the head, and wait behind readers or permits on their
-- bell; a grant returns the token the row has (a row made anew after a prune starts
-- above the high-water mark, by the trigger above). See docs/database.md.
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
    IF NOT django_distlock_lock_within(queue, p_wait) THEN
        RETURN;
    END IF;
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
                    AND (l.next_owner = p_owner OR NOT django_distlock_reserved(
                        l.next_owner, l.next_epoch, l.expires_at, l.next_ttl, t))
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
            IF django_distlock_lock_within(hashtextextended(p_name, -4),
                    least(budget, 1.0)) THEN
                PERFORM pg_advisory_unlock(hashtextextended(p_name, -4));
                belled := cur.fencing;
            END IF;
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
        -- Sleep until the grant's release gives its lock back (or the lease ends, or a
        -- second passes: then look again).
        IF django_distlock_lock_within(hashtextextended(p_name, cur.fencing),
                least(budget, 1.0)) THEN
            woken := cur.fencing;
        END IF;
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

-- Session mode (backends/database/session_mode.py): a name's lock is the two-key
-- session-level advisory lock (k1, k2), the first 8 bytes of SHA-256 of the name's
-- UTF-8 form as two int4 halves. The two-key space is apart from every bigint advisory
-- key (lease mode's, django-pglock's, a user's). This is that key as one bigint,
-- (k1 << 32) | (k2 & 0xffffffff), as pg_locks shows it in classid and objid.
-- IMMUTABLE for the index below: convert_to() is only STABLE, for the database's
-- encoding, which never changes.
CREATE OR REPLACE FUNCTION django_distlock_session_key(p_name text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT ('x' || left(encode(sha256(convert_to(p_name, 'UTF8')), 'hex'), 16))::bit(64)::bigint
$fn$;

-- The listing of session-mode holders goes from pg_locks to the names' rows by key.
CREATE INDEX IF NOT EXISTS distlock_session_key_idx
    ON django_distlock_lock (django_distlock_session_key(name));

-- Session mode's sessions: each one, when it opens, records the host and process of its
-- client here, keyed by its server process (and that process' start, as a pid is
-- reused). UNLOGGED: a crash ends every session, and empties the table.
CREATE UNLOGGED TABLE IF NOT EXISTS django_distlock_session (
    pid integer PRIMARY KEY,
    started timestamptz NOT NULL,
    host text NOT NULL,
    process integer NOT NULL
);

-- Session mode's blocking acquire: wait at most p_secs seconds (NULL: no limit) for the
-- name's two-key advisory lock; the grant's fencing token, or NULL when the wait timed
-- out. A deadlock the server detects is raised (40P01: the client's Deadlock). Before
-- the wait, the session's application_name becomes its holder label p_label, as a
-- try sets it (the listings read it from pg_stat_activity).
CREATE OR REPLACE FUNCTION django_distlock_session_wait(
    p_k1 integer, p_k2 integer, p_secs float8, p_label text
) RETURNS bigint LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('application_name', p_label, false),
        set_config('lock_timeout', CASE WHEN p_secs IS NULL THEN '0'
            ELSE greatest(ceil(p_secs * 1000), 1)::bigint::text || 'ms' END, true);
    BEGIN
        PERFORM pg_advisory_lock(p_k1, p_k2);
    EXCEPTION WHEN lock_not_available THEN
        -- A lock granted just as its wait timed out is kept by the server (and a
        -- session-level one outlives the error): give it back if so.
        IF EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
                AND pid = pg_backend_pid() AND granted
                AND classid = p_k1::oid AND objid = p_k2::oid) THEN
            PERFORM pg_advisory_unlock(p_k1, p_k2);
        END IF;
        RETURN NULL;
    END;
    RETURN nextval('django_distlock_fencing');
END
$fn$;
