-- Every read of `order_key` asks for a key's pending rows (is one queued?
-- which is the next head? what waits behind a held head?). The full
-- index held an entry for every row ever queued, keyed by chat, so queueing
-- a message and finishing its delivery each wrote a page picked at random
-- in a large index: a page of WAL per delivery, twice. Pending rows only:
-- the index stays a few pages, which every batch already holds dirty.
DROP INDEX outbox_order;
CREATE INDEX outbox_pending_order ON outbox(order_key, seq) WHERE state = 'pending';
