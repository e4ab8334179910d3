-- Every event (each customer message, agent message and delivery result)
-- inserted into `events_chat` at a leaf chosen by its chat: with many chats
-- alive at once, a page of its own per event in every commit, the largest
-- share of the write-ahead log after the messages themselves. Nothing in the
-- hub reads the event log by chat (events are looked up by id), so the index
-- cost every write and served no read.
DROP INDEX events_chat;
