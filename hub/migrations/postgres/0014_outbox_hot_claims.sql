-- A claim changes `lease_until`, `attempts` and `first_attempt_at` of the
-- rows it takes. `lease_until` was a column of `outbox_heads`, so no claim
-- could be a heap-only (HOT) update: every claimed row got a new version
-- with a new entry in each of the outbox's seven indexes, and the finish
-- that follows did it again (~20 buffers per claimed row). Without it, a
-- claim touches no indexed column and stays on the row's page when the
-- page has room; the heads' leases are read from the rows, which an
-- index-only scan read anyway on a table this busy (its pages are never
-- all-visible for long).
DROP INDEX outbox_heads;
CREATE INDEX outbox_heads ON outbox(seq, next_attempt_at) WHERE state = 'pending' AND head = 1;
-- Room on each page for the claim's new row versions: rows are appended,
-- and a page filled to the brim makes every update move the row. A claim
-- takes rows queued together, so it updates most rows of their pages at
-- once: half of each page is kept free, about room for a second version of
-- every row (at 70 % a third of the claimed rows still moved). The outbox
-- is a queue pruned behind its deliveries, so the space is a bounded cost.
-- Pages written from now on keep this share free.
ALTER TABLE outbox SET (fillfactor = 50);
-- A delivery result updates its message's delivery state (no indexed
-- column): the same room makes it a HOT update too.
ALTER TABLE messages SET (fillfactor = 90);
