-- Delivery correctness and webhook order (issue 9).
-- PostgreSQL's translation of ../sqlite/0005_delivery_fixes.sql.

-- Named counters that only grow: `visitor_number` (the site's visitor
-- sequence) and `webhook_sequence` (the `sequence` field of every webhook).
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

-- Visitor numbers count 1, 2, 3, ... per site (one hub is one site), assigned
-- once when a client is created; existing clients are numbered in creation order.
ALTER TABLE clients ADD COLUMN visitor_number BIGINT;
UPDATE clients SET visitor_number = (
    SELECT COUNT(*) FROM clients c2
    WHERE c2.created_at < clients.created_at
       OR (c2.created_at = clients.created_at AND c2.id <= clients.id)
);
INSERT INTO counters (name, value)
    VALUES ('visitor_number', (SELECT COALESCE(MAX(visitor_number), 0) FROM clients));
INSERT INTO counters (name, value) VALUES ('webhook_sequence', 0);
CREATE UNIQUE INDEX clients_visitor_number ON clients(visitor_number);
-- The insert takes `counters.value + 1` as the client's number; an upsert that
-- only updates an existing client fires no insert trigger, so burns no number
-- (PostgreSQL, like SQLite, fires AFTER INSERT only for rows really inserted).
CREATE FUNCTION clients_visitor_number_taken() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE counters SET value = NEW.visitor_number
    WHERE name = 'visitor_number' AND value < NEW.visitor_number;
    RETURN NULL;
END;
$$;
CREATE TRIGGER clients_visitor_number_taken AFTER INSERT ON clients
    FOR EACH ROW EXECUTE FUNCTION clients_visitor_number_taken();

-- When the first attempt of a row started (the retry schedule survives restarts),
-- and until when a failing row holds back later rows of its order key.
ALTER TABLE outbox ADD COLUMN first_attempt_at BIGINT;
ALTER TABLE outbox ADD COLUMN hold_until BIGINT;
-- Operator notes on a delivery (for example reply fields that were skipped), a JSON array.
ALTER TABLE outbox ADD COLUMN notes TEXT;
