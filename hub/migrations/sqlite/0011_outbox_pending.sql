-- The deliverer's claim takes the oldest pending rows that are due, in `seq`
-- order. No index gave it pending rows in that order: the planner read every
-- due pending row through `outbox_due`, checked each against the rows ahead
-- of it and sorted them all, so a claim cost grew with the backlog (~200 ms
-- at 100 000 pending rows, while holding the write lock). Only pending rows
-- are in this index, so it stays the size of the backlog while the outbox
-- grows, and a claim reads rows in order until its batch is full.
CREATE INDEX outbox_pending ON outbox(seq) WHERE state = 'pending';
-- When the deliverer next has to look without being kicked: the earliest
-- hold on an order key (rows that failed and wait for a retry). Few rows.
CREATE INDEX outbox_held ON outbox(hold_until) WHERE state = 'pending' AND hold_until IS NOT NULL;
