-- Writers side by side (issue 36): the hot paths no longer take the one
-- write turn, so the webhooks' `sequence` is taken from a sequence, not
-- from a counter row every webhook would lock until its commit. Numbers
-- stay unique and grow in commit order for any one client (and so for any
-- one chat): whoever queues a webhook for a client holds that client's
-- sender lock (store/locks.rs) or the exclusive write turn. Across clients
-- they may commit out of order, and a rolled-back transaction leaves a gap.
-- (SQLite has one writer: its counter row stays, and it has no step 16.)
CREATE SEQUENCE webhook_sequence;
SELECT setval('webhook_sequence', value, true) FROM counters
    WHERE name = 'webhook_sequence' AND value > 0;
