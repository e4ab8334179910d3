-- What each plugin of the live chain did to each event, one row per call:
-- `hub events show` answers "which plugin changed this message?", and
-- `hub plugin replay` compares a candidate with what really happened.
-- Written after the event by the pipeline's recorder (off the request's
-- transaction), so a refused event's outcomes may name an event that was
-- never stored; both go with the event log. `payload_hash` is the SHA-256
-- of the payload the plugin returned (changed only); `verdict` is one of
-- continue, changed, drop, reply, failed.
CREATE TABLE plugin_outcomes (
    event_id     TEXT NOT NULL,
    position     BIGINT NOT NULL,
    plugin       TEXT NOT NULL,
    verdict      TEXT NOT NULL,
    payload_hash TEXT,
    forwards     BIGINT NOT NULL,
    error_kind   TEXT,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (event_id, position)
);
-- Inbound payloads as they entered, before any plugin: kept only when
-- `[storage] keep_inbound_hours` is set (a privacy trade-off: these are
-- the texts `redact` would have masked), pruned past that age.
CREATE TABLE inbound_payloads (
    event_id   TEXT PRIMARY KEY,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX inbound_payloads_age ON inbound_payloads (created_at);
