-- A claim's lease is written in place. InnoDB updates a row in place only when no column
-- changes size; a NULL column that gets a value grows, and such an update rewrites the row
-- (twice the server's work of a delete, which made the lease cost more than the delivery).
-- So the lease's columns hold values of their final size from the insert on: claim_token
-- -1 (no claim's token: tokens are never negative), lease_until the epoch (a lease that
-- ran out: free, as NULL is), and lease_owner a fixed-width CHAR(64) ASCII (the relay's
-- name, cut to 64 bytes by the store; '' for none). Write-backs that end a lease still
-- write NULL: rows they touch take the longer update once. Rows already in the outbox keep
-- their values. MODIFY COLUMN restates each column whole, so running this again changes
-- nothing; lease owners that do not fit the new column (longer, or not ASCII) are
-- cleared first (the name is only shown by `outbox status`).

UPDATE {{.Outbox}} SET lease_owner = NULL
 WHERE lease_owner IS NOT NULL
   AND (LENGTH(lease_owner) > 64 OR lease_owner <> CONVERT(CONVERT(lease_owner USING ascii) USING utf8mb4));

ALTER TABLE {{.Outbox}}
    MODIFY COLUMN claim_token BIGINT NULL DEFAULT -1,
    MODIFY COLUMN lease_owner CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL DEFAULT '',
    MODIFY COLUMN lease_until DATETIME(6) NULL DEFAULT '1970-01-01 00:00:00';
