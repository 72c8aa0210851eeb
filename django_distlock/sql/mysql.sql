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
