-- The MySQL and MariaDB part of the database backend: what the core's migration
-- (django_distlock/migrations/0001_squashed_0014_share_waiters.py) runs there, after
-- Django created the tables from the models. The design and its limits are in
-- docs/database.md ("MySQL and MariaDB") and docs/plans/issue-34.md.
--
-- The migration splits this file on the lines that read "-- ;;" (a routine's body holds
-- semicolons, and DELIMITER is a command of the mysql client, not SQL), puts the binary
-- collation of the server in place of {bin} (utf8mb4_nopad_bin on MariaDB,
-- utf8mb4_0900_bin on MySQL 8), and runs each part under a fixed sql_mode: a routine keeps
-- the sql_mode it was created with, so ours never depend on the server's. Every part can
-- run again (IF NOT EXISTS, DROP ... IF EXISTS before CREATE).

-- A lock name is its bytes. The server's usual collations ignore case, accents and
-- trailing spaces ("Stock:1", "stock:1" and "stock:1 " would be one row) and sort by
-- language; a binary NO PAD collation tells every name apart and sorts by bytes, which
-- is the order the listing pages in (backends/database/sql.py, upper_bound).
ALTER TABLE django_distlock_lock
    MODIFY name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL
-- ;;
ALTER TABLE django_distlock_share
    MODIFY name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL,
    MODIFY owner VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL
-- ;;
-- The listings of held rows, by name and by age (backends/database/mysql_sql.py): MySQL
-- has no partial indexes, so each indexes a generated column that is NULL while the row
-- is free (an index skips no NULLs, but a range above NULL never reads them). Added once
-- (MySQL 8 has no ADD COLUMN IF NOT EXISTS): a procedure asks first.
DROP PROCEDURE IF EXISTS django_distlock_held_columns
-- ;;
CREATE PROCEDURE django_distlock_held_columns() SQL SECURITY INVOKER
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = DATABASE()
            AND table_name = 'django_distlock_lock' AND column_name = 'held_name') THEN
        ALTER TABLE django_distlock_lock
            ADD COLUMN held_name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {bin}
                AS (IF(owner IS NULL, NULL, name)) VIRTUAL,
            ADD COLUMN held_acquired_at DATETIME(6) AS (IF(owner IS NULL, NULL, acquired_at))
                VIRTUAL,
            ADD COLUMN held_expires_at DATETIME(6) AS (IF(owner IS NULL, NULL, expires_at))
                VIRTUAL,
            ADD INDEX distlock_held_idx (held_name),
            ADD INDEX distlock_held_acquired_idx (held_acquired_at, name),
            ADD INDEX distlock_held_expires_idx (held_expires_at, name);
    END IF;
END
-- ;;
CALL django_distlock_held_columns()
-- ;;
DROP PROCEDURE django_distlock_held_columns
-- ;;
-- Fencing tokens. An AUTO_INCREMENT value is never given out twice: a transaction rolled
-- back, or whose session died, does not give its value back, and the counter survives a
-- restart (MySQL 8.0, MariaDB 10.2.4 and later). A grant draws one (a row inserted and
-- deleted in the grant's transaction) and takes the larger of it and the row's last
-- token plus one. The counter is this table's: a rebuild of it that resets the counter
-- (OPTIMIZE or ALTER ... FORCE on the empty table) must not be run.
CREATE TABLE IF NOT EXISTS django_distlock_token (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_tx_grant
-- ;;
-- Transaction mode: the caller's transaction holds the name's row lock (taken by the
-- statement before this call, which bounds the wait); stamp the grant on the row, which
-- commits or rolls back with the caller's transaction. Returns one row: the fencing token
-- and the grant's time (UTC), or none if the name has no row yet. LAST_INSERT_ID() is
-- the caller's again afterwards.
CREATE PROCEDURE django_distlock_tx_grant(
    IN p_name VARCHAR(255), IN p_host VARCHAR(255), IN p_pid INT, IN p_thread VARCHAR(255)
) SQL SECURITY INVOKER
BEGIN
    DECLARE callers BIGINT UNSIGNED DEFAULT LAST_INSERT_ID();
    DECLARE draw BIGINT UNSIGNED;
    INSERT INTO django_distlock_token () VALUES ();
    SET draw = LAST_INSERT_ID();
    DELETE FROM django_distlock_token WHERE id = draw;
    UPDATE django_distlock_lock
    SET fencing = GREATEST(draw, fencing + 1), acquired_at = UTC_TIMESTAMP(6),
        host = p_host, pid = p_pid, thread = p_thread
    WHERE name = p_name;
    DO LAST_INSERT_ID(callers);
    SELECT fencing, acquired_at FROM django_distlock_lock WHERE name = p_name;
END
-- ;;
-- Lease mode. The row decides who holds a name, as on PostgreSQL; the server's named
-- locks (GET_LOCK) only order and wake the waiters, never grant: a named lock dies with
-- its connection and is not replicated, the row is durable. Every time is the server's
-- UTC_TIMESTAMP(6), whatever the session's time zone. Named locks are server-wide and
-- stop at 64 characters, so a name's locks are called by a hash of the database and the
-- name: dl:q:<h> (its queue: the head of the waiters of every kind holds it, the others
-- sleep in GET_LOCK behind it, in arrival order), dl:g:<h>:<fencing> (a grant's bell:
-- held by the granting session until the release gives it back, which wakes the head
-- waiting on it), dl:a:<hash of the owner> (a waiter's liveness, for the listing).
--
-- Kinds. lock() and write_lock() hold the row (a writer's owner ends in ':w'). A reader
-- or a permit is a row of django_distlock_share with its own expiry and token; while
-- any is live the row's owner is '~read' or '~semaphore' and its expiry the latest of
-- theirs, so the exclusive statements see the name held. Every share grant, release and
-- extend locks the row first: the count of live shares it reads is exact. One queue
-- for every kind: a first attempt defers to it, so a waiting writer keeps new readers
-- out, and readers behind a writer are not passed by later ones.
--
-- Who waits, for the listing (backends/database/waiting.py): a waiter writes its row
-- here, keyed by its connection, before it queues; the row counts while its connection
-- holds the row's liveness lock. MEMORY: a restart ends every wait, and empties it.
CREATE TABLE IF NOT EXISTS django_distlock_waiter (
    session BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL,
    alive VARCHAR(64) CHARACTER SET ascii NOT NULL,
    kind VARCHAR(16) CHARACTER SET ascii NOT NULL,
    since DATETIME(6) NOT NULL,
    owner VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL,
    host VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    pid INT NULL,
    thread VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    KEY django_distlock_waiter_name (name)
) ENGINE = MEMORY
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_recompute
-- ;;
-- The row shows its live shares again (its lock is held): the latest end of them, and
-- no owner when none is left.
CREATE PROCEDURE django_distlock_recompute(IN p_name VARCHAR(255), IN p_at DATETIME(6))
SQL SECURITY INVOKER
BEGIN
    DECLARE last_end DATETIME(6);
    SELECT MAX(expires_at) INTO last_end FROM django_distlock_share
    WHERE name = p_name AND expires_at > p_at;
    -- Assignments run left to right (this file's sql_mode): expires_at first.
    UPDATE django_distlock_lock
    SET expires_at = COALESCE(last_end, expires_at), owner = IF(last_end IS NULL, NULL, owner)
    WHERE name = p_name AND owner IN ('~read', '~semaphore');
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_take
-- ;;
-- Grant the name to p_owner as p_kind ('exclusive', 'write', 'read', 'semaphore' of
-- p_limit permits) if p_may and the name allows it (an attempt retried after a lost
-- connection finds its own grant and takes it again), in one transaction that draws the
-- fencing token (see django_distlock_token above); make the name's row at its first use.
-- The grant's bell is taken before the commit, so a waiter that reads the grant finds
-- it held. Out: o_fencing (NULL: not granted), o_gen (the token when this session took
-- the bell); on a miss o_block (the token of the grant to wait for: the holder's, or of
-- the live share that ends first; NULL when the name is free), o_left (seconds until
-- that grant ends), o_stored (a semaphore's stored limit, when it is not p_limit).
CREATE PROCEDURE django_distlock_take(
    IN p_name VARCHAR(255), IN p_hash CHAR(32), IN p_owner VARCHAR(64), IN p_kind VARCHAR(16),
    IN p_limit INT, IN p_ttl DOUBLE, IN p_host VARCHAR(255), IN p_pid INT,
    IN p_thread VARCHAR(255), IN p_may BOOLEAN, IN p_at DATETIME(6),
    OUT o_fencing BIGINT, OUT o_gen BIGINT, OUT o_left DOUBLE, OUT o_block BIGINT,
    OUT o_stored INT
) SQL SECURITY INVOKER
BEGIN
    DECLARE later DATETIME(6) DEFAULT p_at + INTERVAL ROUND(p_ttl * 1000000) MICROSECOND;
    DECLARE sentinel VARCHAR(16) DEFAULT
        CASE p_kind WHEN 'read' THEN '~read' WHEN 'semaphore' THEN '~semaphore' END;
    DECLARE draw BIGINT UNSIGNED;
    DECLARE duplicate BOOLEAN DEFAULT FALSE;
    DECLARE cur_owner VARCHAR(64);
    DECLARE cur_expires DATETIME(6);
    DECLARE cur_limit INT;
    DECLARE live INT;
    DECLARE mine BOOLEAN;
    DECLARE CONTINUE HANDLER FOR 1062 SET duplicate = TRUE;  -- a racing creator made it
    -- Two creators of a name whose row a prune deleted (not yet purged) each take a shared
    -- lock of the deleted record, then both want it exclusive: InnoDB rolls one back
    -- (its whole transaction: nothing granted, its drawn token unused), the other makes it.
    DECLARE CONTINUE HANDLER FOR 1213 SET duplicate = TRUE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    SET o_fencing = NULL, o_gen = NULL, o_left = NULL, o_block = NULL, o_stored = NULL;
    IF sentinel IS NULL THEN
        START TRANSACTION;
        -- A miss matches no row: it writes nothing and never delays the holder.
        UPDATE django_distlock_lock
        SET owner = p_owner, acquired_at = p_at, expires_at = later,
            host = p_host, pid = p_pid, thread = p_thread
        WHERE name = p_name AND p_may
            AND (owner IS NULL OR expires_at <= p_at OR owner = p_owner);
        IF ROW_COUNT() = 1 THEN
            INSERT INTO django_distlock_token () VALUES ();
            SET draw = LAST_INSERT_ID();
            DELETE FROM django_distlock_token WHERE id = draw;
            UPDATE django_distlock_lock SET fencing = GREATEST(draw, fencing + 1)
            WHERE name = p_name;
            SELECT fencing INTO o_fencing FROM django_distlock_lock WHERE name = p_name;
        ELSEIF p_may AND NOT EXISTS (SELECT 1 FROM django_distlock_lock WHERE name = p_name)
        THEN
            INSERT INTO django_distlock_token () VALUES ();
            SET draw = LAST_INSERT_ID();
            DELETE FROM django_distlock_token WHERE id = draw;
            INSERT INTO django_distlock_lock
                (name, owner, fencing, acquired_at, expires_at, host, pid, thread)
            VALUES (p_name, p_owner, draw, p_at, later, p_host, p_pid, p_thread);
            IF NOT duplicate THEN
                SET o_fencing = draw;
            END IF;
        END IF;
    ELSE
        -- The row first, committed on its own (a duplicate key's shared lock must not
        -- stay for the FOR UPDATE below: two racing creators would deadlock).
        IF NOT EXISTS (SELECT 1 FROM django_distlock_lock WHERE name = p_name) THEN
            INSERT INTO django_distlock_lock (name, fencing, host, thread)
            VALUES (p_name, 0, '', '');
        END IF;
        START TRANSACTION;
        SELECT owner, expires_at, share_limit INTO cur_owner, cur_expires, cur_limit
        FROM django_distlock_lock WHERE name = p_name FOR UPDATE;
        SELECT count(*), COALESCE(MAX(owner = p_owner), FALSE) INTO live, mine
        FROM django_distlock_share WHERE name = p_name AND expires_at > p_at;
        IF mine OR (p_may AND (cur_owner IS NULL OR cur_expires <= p_at OR cur_owner = sentinel)
                AND (p_limit IS NULL OR (live < p_limit AND (cur_owner IS NULL
                    OR cur_expires <= p_at OR cur_limit = p_limit)))) THEN
            INSERT INTO django_distlock_token () VALUES ();
            SET draw = LAST_INSERT_ID();
            DELETE FROM django_distlock_token WHERE id = draw;
            -- Assignments run left to right (this file's sql_mode): the owner last.
            UPDATE django_distlock_lock
            SET fencing = GREATEST(draw, fencing + 1), acquired_at = p_at,
                expires_at = IF(owner = sentinel AND expires_at > later, expires_at, later),
                host = p_host, pid = p_pid, thread = p_thread,
                share_limit = COALESCE(p_limit, share_limit), owner = sentinel
            WHERE name = p_name;
            SELECT fencing INTO o_fencing FROM django_distlock_lock WHERE name = p_name;
            INSERT INTO django_distlock_share
                (name, owner, kind, fencing, acquired_at, expires_at, host, pid, thread)
            VALUES (p_name, p_owner, p_kind, o_fencing, p_at, later, p_host, p_pid, p_thread)
            ON DUPLICATE KEY UPDATE fencing = o_fencing, acquired_at = p_at,
                expires_at = later;
        END IF;
    END IF;
    IF o_fencing IS NOT NULL THEN
        SET o_gen = IF(GET_LOCK(CONCAT('dl:g:', p_hash, ':', o_fencing), 0) = 1,
            o_fencing, NULL);
    END IF;
    COMMIT;
    IF o_fencing IS NULL THEN
        SET cur_owner = NULL;
        SELECT owner, fencing, GREATEST(TIMESTAMPDIFF(MICROSECOND, p_at, expires_at), 0) / 1000000,
            IF(p_kind = 'semaphore' AND owner = '~semaphore' AND share_limit <> p_limit,
                share_limit, NULL)
        INTO cur_owner, o_block, o_left, o_stored FROM django_distlock_lock
        WHERE name = p_name AND owner IS NOT NULL AND expires_at > p_at;
        IF cur_owner IN ('~read', '~semaphore') THEN  -- wait for the share that ends first
            SELECT fencing, GREATEST(TIMESTAMPDIFF(MICROSECOND, p_at, expires_at), 0) / 1000000
            INTO o_block, o_left FROM django_distlock_share
            WHERE name = p_name AND expires_at > p_at ORDER BY expires_at, fencing LIMIT 1;
        END IF;
    END IF;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_acquire
-- ;;
-- Lease mode, one attempt of any kind (an uncontended acquire is this one call). A
-- first attempt does not pass the waiters queued for the name (p_pass: it may). One row:
-- granted, fencing, acquired_at, expires_at, retry_after (a miss: seconds until the
-- grant in the way ends), generation (see django_distlock_take), stored limit (a
-- semaphore's, when it is not p_limit).
CREATE PROCEDURE django_distlock_acquire(
    IN p_name VARCHAR(255), IN p_owner VARCHAR(64), IN p_kind VARCHAR(16), IN p_limit INT,
    IN p_ttl DOUBLE, IN p_host VARCHAR(255), IN p_pid INT, IN p_thread VARCHAR(255),
    IN p_pass BOOLEAN
) SQL SECURITY INVOKER
BEGIN
    DECLARE h CHAR(32) DEFAULT LEFT(SHA2(CONCAT(DATABASE(), 0x00, p_name), 256), 32);
    DECLARE t DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    DECLARE f, gen, block BIGINT;
    DECLARE left_s DOUBLE;
    DECLARE stored INT;
    CALL django_distlock_take(p_name, h, p_owner, p_kind, p_limit, p_ttl, p_host, p_pid,
        p_thread, p_pass OR IS_FREE_LOCK(CONCAT('dl:q:', h)) = 1, t, f, gen, left_s, block,
        stored);
    SELECT f IS NOT NULL, f, IF(f IS NULL, NULL, t),
        IF(f IS NULL, NULL, t + INTERVAL ROUND(p_ttl * 1000000) MICROSECOND), left_s, gen,
        stored;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_wait
-- ;;
-- Lease mode, the blocking wait of any kind: queue for the name (its queue lock, in
-- arrival order), then, at the head, take the name when it allows this kind, else sleep
-- until the release of the grant in the way gives its bell back (or its lease ends, or
-- two seconds pass: look again; a semaphore's head waits on the permit that ends first,
-- and notices another's release at its next look). At most p_wait seconds. A wait
-- stopped by KILL QUERY (an asyncio task cancelled) leaves at once, granted nothing: a
-- named-lock wait or a sleep that is killed returns, it does not fail. So does the wait
-- of a client that is gone (its named-lock wait returns early), rather than take the
-- name for nobody. A head whose blocker's session ended without a release sleeps in
-- one-second slices until that lease ends; a head that dies then is not noticed by the
-- sleep, and may take the name for its own ttl (two failures at once: slow, never
-- unsafe). One row, as django_distlock_acquire's, except that on a grant retry_after is
-- the seconds the server waited before granting.
CREATE PROCEDURE django_distlock_wait(
    IN p_name VARCHAR(255), IN p_owner VARCHAR(64), IN p_kind VARCHAR(16), IN p_limit INT,
    IN p_ttl DOUBLE, IN p_host VARCHAR(255), IN p_pid INT, IN p_thread VARCHAR(255),
    IN p_wait DOUBLE
) SQL SECURITY INVOKER
BEGIN
    DECLARE h CHAR(32) DEFAULT LEFT(SHA2(CONCAT(DATABASE(), 0x00, p_name), 256), 32);
    DECLARE alive VARCHAR(64) DEFAULT CONCAT('dl:a:', LEFT(SHA2(p_owner, 256), 32));
    DECLARE started DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    DECLARE deadline DATETIME(6) DEFAULT started + INTERVAL ROUND(p_wait * 1000000) MICROSECOND;
    DECLARE t DATETIME(6);
    DECLARE budget, asked DOUBLE;
    DECLARE got INT;
    DECLARE woken, f, gen, block BIGINT;
    DECLARE left_s DOUBLE;
    DECLARE stored INT;
    DO GET_LOCK(alive, 0);
    -- The waiters' rows stay out of the binary log where the user may say so (see
    -- django_distlock_session_open): a replica that restarted has lost its MEMORY rows,
    -- and a replicated delete of one stops its replication (error 1032).
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1227 BEGIN END;
        SET SESSION sql_log_bin = 0;
    END;
    DELETE w FROM django_distlock_waiter w  -- the rows of waits that are gone
    WHERE w.name = p_name AND NOT IS_USED_LOCK(w.alive) <=> w.session;
    REPLACE INTO django_distlock_waiter
        (session, name, alive, kind, since, owner, host, pid, thread)
    VALUES (CONNECTION_ID(), p_name, alive, p_kind, started, p_owner, p_host, p_pid, p_thread);
    IF @@session.sql_log_bin = 0 THEN  -- the lock rows are logged
        SET SESSION sql_log_bin = 1;
    END IF;
    SET got = GET_LOCK(CONCAT('dl:q:', h), p_wait);
    wait: WHILE got = 1 DO
        SET t = UTC_TIMESTAMP(6);
        CALL django_distlock_take(p_name, h, p_owner, p_kind, p_limit, p_ttl, p_host, p_pid,
            p_thread, TRUE, t, f, gen, left_s, block, stored);
        IF f IS NOT NULL OR stored IS NOT NULL THEN
            LEAVE wait;
        END IF;
        SET budget = TIMESTAMPDIFF(MICROSECOND, t, deadline) / 1000000;
        IF block IS NOT NULL THEN
            SET budget = LEAST(budget, left_s);
        END IF;
        IF budget <= 0 THEN
            LEAVE wait;
        END IF;
        IF block IS NULL THEN
            -- Free, yet not granted: a racing first use made the row. Look again.
            IF SLEEP(LEAST(budget, 0.01)) = 1 THEN
                LEAVE wait;  -- killed
            END IF;
            ITERATE wait;
        END IF;
        IF woken = block THEN
            -- This grant's bell came to us, its lease did not end: its session ended
            -- without a release. Look again in a while (the lease ends by itself).
            IF SLEEP(LEAST(budget, 1.0)) = 1 THEN
                LEAVE wait;  -- killed
            END IF;
            ITERATE wait;
        END IF;
        IF woken IS NOT NULL THEN
            DO RELEASE_LOCK(CONCAT('dl:g:', h, ':', woken));
            SET woken = NULL;
        END IF;
        -- MySQL 8 waits whole seconds (MariaDB to the microsecond): round up there.
        SET asked = IF(@@version LIKE '%MariaDB%', LEAST(budget, 2.0), CEIL(LEAST(budget, 2.0)));
        SET got = GET_LOCK(CONCAT('dl:g:', h, ':', block), asked);
        IF got IS NULL OR (got = 0 AND TIMESTAMPDIFF(MICROSECOND, t, UTC_TIMESTAMP(6))
                < asked * 1000000 - 100000) THEN
            -- Killed (NULL), or the client is gone: the server ends a named-lock wait of
            -- a client that left with 0, before its time, and runs the procedure on.
            LEAVE wait;
        END IF;
        IF got = 1 THEN
            SET woken = block;
        END IF;
        SET got = 1;
    END WHILE;
    IF woken IS NOT NULL THEN
        DO RELEASE_LOCK(CONCAT('dl:g:', h, ':', woken));
    END IF;
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1227 BEGIN END;
        SET SESSION sql_log_bin = 0;
    END;
    DELETE FROM django_distlock_waiter WHERE session = CONNECTION_ID();
    IF @@session.sql_log_bin = 0 THEN
        SET SESSION sql_log_bin = 1;
    END IF;
    DO RELEASE_LOCK(CONCAT('dl:q:', h)), RELEASE_LOCK(alive);
    SELECT f IS NOT NULL, f, IF(f IS NULL, NULL, t),
        IF(f IS NULL, NULL, t + INTERVAL ROUND(p_ttl * 1000000) MICROSECOND),
        IF(f IS NULL, left_s, GREATEST(TIMESTAMPDIFF(MICROSECOND, started, t), 0) / 1000000),
        gen, stored;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_release
-- ;;
-- Lease mode, any kind: free the name if p_owner holds its row, or delete p_owner's
-- share (and the name's expired ones); then give the grant's bell back (p_generation,
-- when this session holds it), which wakes the head waiting on it after the commit.
-- One row: valid (whether the lease was still live; NULL: not held).
CREATE PROCEDURE django_distlock_release(
    IN p_name VARCHAR(255), IN p_owner VARCHAR(64), IN p_generation BIGINT
) SQL SECURITY INVOKER
BEGIN
    DECLARE t DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    DECLARE valid BOOLEAN DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    START TRANSACTION;
    SELECT IF(owner = p_owner, expires_at > t, NULL) INTO valid FROM django_distlock_lock
    WHERE name = p_name FOR UPDATE;
    IF valid IS NOT NULL THEN
        UPDATE django_distlock_lock SET owner = NULL WHERE name = p_name;
    ELSE
        SELECT expires_at > t INTO valid FROM django_distlock_share
        WHERE name = p_name AND owner = p_owner;
        IF valid IS NOT NULL THEN
            DELETE FROM django_distlock_share
            WHERE name = p_name AND (owner = p_owner OR expires_at <= t);
            CALL django_distlock_recompute(p_name, t);
        END IF;
    END IF;
    COMMIT;
    IF p_generation IS NOT NULL THEN
        DO RELEASE_LOCK(CONCAT('dl:g:', LEFT(SHA2(CONCAT(DATABASE(), 0x00, p_name), 256), 32),
            ':', p_generation));
    END IF;
    SELECT valid;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_extend
-- ;;
-- Lease mode, any kind: extend a live lease (the row's holder, or a share) by p_ttl
-- from now. One row (fencing, acquired_at, expires_at), none if the lease was not live.
CREATE PROCEDURE django_distlock_extend(
    IN p_ttl DOUBLE, IN p_name VARCHAR(255), IN p_owner VARCHAR(64)
) SQL SECURITY INVOKER
BEGIN
    DECLARE t DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    DECLARE later DATETIME(6) DEFAULT t + INTERVAL ROUND(p_ttl * 1000000) MICROSECOND;
    DECLARE matched, shared INT DEFAULT 0;
    DECLARE locked INT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    UPDATE django_distlock_lock SET expires_at = later
    WHERE name = p_name AND owner = p_owner AND expires_at > t;
    SET matched = ROW_COUNT();
    IF matched = 0 AND EXISTS (
            SELECT 1 FROM django_distlock_share WHERE name = p_name AND owner = p_owner) THEN
        START TRANSACTION;
        SELECT 1 INTO locked FROM django_distlock_lock WHERE name = p_name FOR UPDATE;
        UPDATE django_distlock_share SET expires_at = later
        WHERE name = p_name AND owner = p_owner AND expires_at > t;
        SET shared = ROW_COUNT();
        IF shared > 0 THEN
            CALL django_distlock_recompute(p_name, t);
        END IF;
        COMMIT;
    END IF;
    SELECT fencing, acquired_at, expires_at FROM django_distlock_lock
    WHERE matched > 0 AND name = p_name AND owner = p_owner
    UNION ALL
    SELECT fencing, acquired_at, expires_at FROM django_distlock_share
    WHERE shared > 0 AND name = p_name AND owner = p_owner;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_force
-- ;;
-- Lease mode: free what holds the name among the shares and the row's holder whose
-- owner id starts with p_expected ('': all of them); a holder learns it at its next
-- extend or release, the head of the queue at its next look (within two seconds). One
-- row when anything held was freed, none otherwise.
CREATE PROCEDURE django_distlock_force(IN p_name VARCHAR(255), IN p_expected VARCHAR(64))
SQL SECURITY INVOKER
BEGIN
    DECLARE t DATETIME(6) DEFAULT UTC_TIMESTAMP(6);
    DECLARE shares, held INT DEFAULT 0;
    DECLARE locked INT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    START TRANSACTION;
    SELECT 1 INTO locked FROM django_distlock_lock WHERE name = p_name FOR UPDATE;
    DELETE FROM django_distlock_share
    WHERE name = p_name AND expires_at > t AND LEFT(owner, CHAR_LENGTH(p_expected)) = p_expected;
    SET shares = ROW_COUNT();
    UPDATE django_distlock_lock SET owner = NULL
    WHERE name = p_name AND owner IS NOT NULL AND expires_at > t
        AND LEFT(owner, CHAR_LENGTH(p_expected)) = p_expected;
    SET held = ROW_COUNT();
    IF shares > 0 THEN
        CALL django_distlock_recompute(p_name, t);
    END IF;
    COMMIT;
    SELECT 1 FROM DUAL WHERE held + shares > 0;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_prune
-- ;;
-- Delete up to p_batch rows idle for p_idle seconds (no holder, lease or grant that
-- recent, no writer's mark, no reader or permit), in one transaction. A row locked at
-- that moment (a grant in progress, a transaction-mode holder) is skipped, never waited
-- for. A name used again gets a new row whose tokens come from the counter, above every
-- token the pruned row had. One row: how many rows were deleted.
CREATE PROCEDURE django_distlock_prune(IN p_idle DOUBLE, IN p_batch INT)
SQL SECURITY INVOKER
BEGIN
    DECLARE cutoff DATETIME(6) DEFAULT
        UTC_TIMESTAMP(6) - INTERVAL ROUND(p_idle * 1000000) MICROSECOND;
    DECLARE gone INT;
    -- The names first, then the rows by their key: a DELETE that scanned the table would
    -- wait for the row lock of every row it reads, the held ones too.
    CREATE TEMPORARY TABLE IF NOT EXISTS django_distlock_pruned (
        name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL PRIMARY KEY
    ) ENGINE = MEMORY;
    DELETE FROM django_distlock_pruned;
    START TRANSACTION;
    INSERT INTO django_distlock_pruned (name)
    SELECT l.name FROM django_distlock_lock l
    WHERE l.next_owner IS NULL
        AND (l.intent_owner IS NULL OR l.intent_until < cutoff)
        AND (l.acquired_at IS NULL OR l.acquired_at < cutoff)
        AND (l.expires_at IS NULL OR l.expires_at < cutoff)
        AND NOT EXISTS (SELECT 1 FROM django_distlock_share s WHERE s.name = l.name)
    LIMIT p_batch FOR UPDATE SKIP LOCKED;
    DELETE l FROM django_distlock_pruned p STRAIGHT_JOIN django_distlock_lock l
        ON l.name = p.name;
    SET gone = ROW_COUNT();
    COMMIT;
    SELECT gone;
END
-- ;;
-- Session mode (backends/database/session_mysql.py). A name's lock is the named lock
-- dl:s:<hash of the database and the name> of the session that was granted it: nothing
-- else decides who holds, and the lock ends with its session; the server keeps no owner
-- per grant (force release ends the holding session, whoever holds).
-- django_distlock_session_grant, a MEMORY table (no redo log, no flush, empty after a
-- restart, when every session is gone), says who holds: a row per session and slot,
-- slot 0 for a grant of a session that holds no other lock (the usual case), 1, 2, ...
-- for a thread's further grants on the session of its first, each naming its lock, the
-- name, and the holder (host, pid, thread and context; not the owner, which changes at
-- every grant). A row counts while its connection holds its lock (IS_USED_LOCK(lk) =
-- session), and outlives the release: a session's next grant of the same name by the
-- same holder writes nothing (the session knows what its row says); another grant
-- overwrites the row in place. When it was granted is the holder session's idle time in
-- the process list. A session's grant that holds alone through the procedure deletes its
-- rows past slot 0, and a new session deletes the rows of sessions that are gone (each
-- session holds dl:c:<its connection id> while it lives). A MEMORY table's rows have a
-- fixed size (about 1.4 KB here): the server's max_heap_table_size when the table was
-- made bounds how many sessions it lists at once (16 MB: about 12,000); a grant that
-- finds it full is refused, and its locks given back.
CREATE TABLE IF NOT EXISTS django_distlock_session_grant (
    session BIGINT UNSIGNED NOT NULL,
    slot SMALLINT UNSIGNED NOT NULL,
    lk CHAR(37) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL,
    label VARCHAR(63) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    host VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {bin} NOT NULL,
    pid INT NOT NULL,
    PRIMARY KEY (session, slot) USING BTREE,
    KEY distlock_session_grant_lock (lk) USING HASH,
    KEY distlock_session_grant_name (name) USING BTREE
) ENGINE = MEMORY
-- ;;
-- Session mode's fencing tokens: (epoch << 44) + the calls of UUID_SHORT() since the
-- epoch began. UUID_SHORT() grows by one at each call while the server runs, and starts
-- again from the server's start time (in seconds) at each start: a clock set back, or a
-- crash within the second of the start, would give its values again. So each server run
-- draws an epoch, once, from an AUTO_INCREMENT counter, which gives no value twice and
-- survives a crash (MySQL 8.0 and MariaDB 10.2.4 and later; a MariaDB SEQUENCE does not:
-- 10.11 starts one again from its first value after a SIGKILL, measured); the run's
-- epoch and the UUID_SHORT() it began at are kept in a MEMORY table, empty after each
-- start. 44 bits: 17.6 trillion grants per run; 19 bits: half a million runs. The run's
-- row is the one of the newest epoch drawn, and of this server: a replica receives its
-- primary's epochs (the counter keeps the newest), so that, promoted, it draws above
-- them, and may receive the primary's rows (MEMORY tables are replicated as any other),
-- which it does not use: UUID_SHORT() is each server's own (its server_id in the top
-- byte, its start time below). A server that takes the primary's place again after
-- following another has received a newer epoch, and draws anew. The rows of both are
-- only ever inserted (a row per draw: one per server run): a replica that restarted has
-- lost its MEMORY rows, and a row event that updates or deletes a row a replica lacks
-- stops its replication (error 1032).
CREATE TABLE IF NOT EXISTS django_distlock_session_epoch (
    epoch BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE = InnoDB
-- ;;
CREATE TABLE IF NOT EXISTS django_distlock_session_start (
    epoch BIGINT NOT NULL PRIMARY KEY,
    base BIGINT UNSIGNED NOT NULL,
    server INT UNSIGNED NOT NULL
) ENGINE = MEMORY
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_session_open
-- ;;
-- Session mode: set a new session of the backend's up. Its holder rows stay out of the
-- binary log where its user may say so (sql_log_bin: SUPER or BINLOG ADMIN on MariaDB,
-- SYSTEM_VARIABLES_ADMIN or SESSION_VARIABLES_ADMIN on MySQL 8; else they are logged, and
-- with sync_binlog = 1 flushed, at each grant): they mean nothing on a replica, whose
-- sessions are others. What a replica needs, the epochs (and the run's row, which says
-- whose they are), django_distlock_session_take logs all the same. The session takes
-- its own named lock dl:c:<connection id>, which says it lives; then the rows of
-- sessions that are gone go (a live session's rows stay, also while they do not count:
-- the session writes none at its next grant of the same name).
CREATE PROCEDURE django_distlock_session_open() SQL SECURITY INVOKER
BEGIN
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1227 BEGIN END;  -- not allowed: the rows are logged
        SET SESSION sql_log_bin = 0;
    END;
    DO GET_LOCK(CONCAT('dl:c:', CONNECTION_ID()), 0);
    DELETE FROM django_distlock_session_grant
    WHERE NOT IS_USED_LOCK(lk) <=> session
        AND IS_USED_LOCK(CONCAT('dl:c:', session)) IS NULL;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_session_take
-- ;;
-- Session mode: take the named lock p_lock, waiting up to p_wait seconds (0: a try; a
-- wait is rounded up to whole seconds on MySQL 8, which waits no fraction), and record
-- the holder (p_label is 'dl <short owner id> <holder>': the row keeps the holder
-- part). A procedure, not a function: the server's detection of deadlocks between named
-- locks does not reach a GET_LOCK inside a stored function (its waits just time out),
-- and it does reach one in a procedure. p_alone: the session holds no
-- other lock (the grant takes slot 0, and the session's rows past it go); else the
-- grant takes its lock's old row of this session, or one that no longer counts, or a
-- new slot. One row: the fencing token (see the tables above), the server's time, and
-- the run's epoch and base (the client keeps them, for the grants it sends without this
-- procedure: session_mysql.py); the token is NULL when the lock was not had (busy, timed
-- out, or the wait killed).
CREATE PROCEDURE django_distlock_session_take(
    IN p_lock CHAR(37), IN p_name VARCHAR(255), IN p_wait DOUBLE, IN p_label VARCHAR(63),
    IN p_host VARCHAR(64), IN p_pid INT, IN p_alone BOOL
) SQL SECURITY INVOKER
BEGIN
    DECLARE got INT;
    DECLARE e BIGINT;
    DECLARE s INT DEFAULT 0;
    DECLARE unlogged BOOL;
    DECLARE EXIT HANDLER FOR 1114  -- the table is full
    BEGIN
        DO RELEASE_LOCK(p_lock);
        SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1114, MESSAGE_TEXT =
            'django_distlock_session_grant is full: raise max_heap_table_size, then make '
            'the table again (docs/database.md, session mode on MySQL and MariaDB)';
    END;
    SET got = GET_LOCK(p_lock,
        IF(p_wait <= 0 OR @@version LIKE '%MariaDB%', p_wait, CEIL(p_wait)));
    IF got = 1 THEN
        IF p_alone THEN
            DELETE FROM django_distlock_session_grant
            WHERE session = CONNECTION_ID() AND slot > 0;
        ELSE
            SET s = COALESCE(
                (SELECT slot FROM django_distlock_session_grant
                 WHERE session = CONNECTION_ID()
                     AND (lk = p_lock OR NOT IS_USED_LOCK(lk) <=> CONNECTION_ID())
                 ORDER BY lk = p_lock DESC, slot LIMIT 1),
                (SELECT MAX(slot) + 1 FROM django_distlock_session_grant
                 WHERE session = CONNECTION_ID()),
                0);
        END IF;
        REPLACE INTO django_distlock_session_grant (session, slot, lk, name, label, host, pid)
        VALUES (CONNECTION_ID(), s, p_lock, p_name, SUBSTRING(p_label, 13), p_host, p_pid);
        IF @django_distlock_epoch IS NULL THEN
            -- This session's first grant: the run's epoch and base, kept in the session
            -- (a restart ends every session, so a session's copy is always its run's).
            -- Logged, also on a session that logs no holder rows: a replica, promoted,
            -- draws above these epochs.
            SET unlogged = @@session.sql_log_bin = 0;
            IF unlogged THEN
                SET SESSION sql_log_bin = 1;
            END IF;
            BEGIN  -- once per session: under a named lock, so that one run has one epoch
                DECLARE run VARCHAR(64) DEFAULT CONCAT('dl:s:run:', MD5(DATABASE()));
                DECLARE EXIT HANDLER FOR SQLEXCEPTION
                BEGIN
                    DO RELEASE_LOCK(run);
                    RESIGNAL;
                END;
                IF NOT GET_LOCK(run, 10) <=> 1 THEN
                    SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT =
                        'django_distlock_session_take: another session drew no epoch in 10 s';
                END IF;
                SET e = (SELECT s.epoch FROM django_distlock_session_start s
                         WHERE s.epoch = (SELECT MAX(c.epoch) FROM django_distlock_session_epoch c)
                             AND s.server = @@server_id);
                IF e IS NULL THEN  -- the first grant of this run: its epoch
                    INSERT INTO django_distlock_session_epoch () VALUES ();
                    SET e = LAST_INSERT_ID();
                    INSERT INTO django_distlock_session_start VALUES (e, UUID_SHORT(), @@server_id);
                END IF;
                DO RELEASE_LOCK(run);
            END;
            IF unlogged THEN
                SET SESSION sql_log_bin = 0;
            END IF;
            SELECT epoch, base INTO @django_distlock_epoch, @django_distlock_base
            FROM django_distlock_session_start WHERE epoch = e;
        END IF;
        SELECT (@django_distlock_epoch << 44) + (UUID_SHORT() - @django_distlock_base),
            UTC_TIMESTAMP(6), @django_distlock_epoch, @django_distlock_base;
    ELSE
        SELECT NULL, UTC_TIMESTAMP(6), NULL, NULL;
    END IF;
END
-- ;;
DROP PROCEDURE IF EXISTS django_distlock_session_force
-- ;;
-- Session mode: end the session that holds p_lock, if one does, and wait up to 5 s for
-- the server to free the lock. One row: whether a session was ended.
CREATE PROCEDURE django_distlock_session_force(IN p_lock CHAR(37))
SQL SECURITY INVOKER
BEGIN
    DECLARE holder BIGINT UNSIGNED DEFAULT IS_USED_LOCK(p_lock);
    DECLARE waited INT DEFAULT 0;
    IF holder IS NOT NULL THEN
        KILL CONNECTION holder;
        WHILE IS_USED_LOCK(p_lock) <=> holder AND waited < 5000 DO
            DO SLEEP(0.001);
            SET waited = waited + 1;
        END WHILE;
        SELECT TRUE;
    ELSE
        SELECT FALSE;
    END IF;
END
