-- A claim that found nothing to take read every pending row: each was
-- checked against the rows ahead of it in its order key, and when every
-- key's first row was in flight (a burst to a few busy chats, a backlog
-- behind slow receivers) none qualified, so the whole backlog was read,
-- ~100 ms at 100 000 rows, while holding the write lock. `head` marks the
-- first pending row of each order key (every row without a key): the
-- writes that queue, finish and replay rows keep it, and a claim reads the
-- heads that are due, plus the rows behind a head whose hold has passed.
ALTER TABLE outbox ADD COLUMN head INTEGER NOT NULL DEFAULT 0;
UPDATE outbox SET head = 1 WHERE state = 'pending' AND (order_key IS NULL
    OR seq = (SELECT MIN(p.seq) FROM outbox p
              WHERE p.order_key = outbox.order_key AND p.state = 'pending'));
-- Covering: a claim decides on the index alone which heads it takes.
CREATE INDEX outbox_heads ON outbox(seq, next_attempt_at, lease_until)
    WHERE state = 'pending' AND head = 1;
