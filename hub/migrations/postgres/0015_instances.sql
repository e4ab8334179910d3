-- Each running hub is a row here with a heartbeat, and each lease names the
-- instance that took it: a restarted instance gives back its own leases at
-- start, and the leases of an instance whose heartbeat stopped are taken
-- over after `[delivery] takeover_ms`, not after `lease_ms`. (SQLite has one
-- instance, which gives back every lease at start; the columns are the same
-- on both databases.) `lease_owner` is in no index: on PostgreSQL a claim
-- must stay a heap-only update (step 14).
CREATE TABLE instances (
    id           TEXT PRIMARY KEY,
    boot         TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
ALTER TABLE outbox ADD COLUMN lease_owner TEXT;
