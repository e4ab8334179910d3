-- The spine: channels, agents, clients, chats, messages, the event log and the outbox.
-- Times are Unix milliseconds; booleans are 0/1 integers so the SQL stays portable.

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE channels (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    public_id         TEXT NOT NULL UNIQUE,
    name              TEXT NOT NULL UNIQUE,
    customer_endpoint TEXT NOT NULL,
    chunked           INTEGER NOT NULL DEFAULT 0,
    declared          INTEGER NOT NULL DEFAULT 0,
    created_at        BIGINT NOT NULL
);

-- Agents are assigned by e-mail so a channel may name an agent created later.
CREATE TABLE channel_agents (
    channel_id  BIGINT NOT NULL REFERENCES channels(id) ON DELETE CASCADE,
    agent_email TEXT NOT NULL,
    PRIMARY KEY (channel_id, agent_email)
);
CREATE INDEX channel_agents_email ON channel_agents(agent_email);

CREATE TABLE agents (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    email      TEXT NOT NULL UNIQUE,
    photo      TEXT,
    token_hash TEXT NOT NULL UNIQUE,
    online     INTEGER NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL
);

CREATE TABLE clients (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    channel_id       BIGINT NOT NULL REFERENCES channels(id) ON DELETE CASCADE,
    external_key     TEXT NOT NULL,
    external_id_json TEXT NOT NULL,
    name             TEXT,
    phone            TEXT,
    email            TEXT,
    photo            TEXT,
    url              TEXT,
    invite           TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    UNIQUE (channel_id, external_key)
);

CREATE TABLE chats (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    channel_id      BIGINT NOT NULL REFERENCES channels(id) ON DELETE CASCADE,
    client_id       BIGINT NOT NULL REFERENCES clients(id) ON DELETE CASCADE,
    state           TEXT NOT NULL,
    agent_id        BIGINT REFERENCES agents(id),
    opened_at       BIGINT NOT NULL,
    accepted_at     BIGINT,
    closed_at       BIGINT,
    last_message_at BIGINT NOT NULL
);
CREATE INDEX chats_client_state ON chats(client_id, state);
CREATE INDEX chats_channel_state ON chats(channel_id, state);

CREATE TABLE messages (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    uid            TEXT NOT NULL UNIQUE,
    chat_id        BIGINT NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    author         TEXT NOT NULL,
    agent_id       BIGINT REFERENCES agents(id),
    body           TEXT NOT NULL,
    delivery_state TEXT,
    delivery_error TEXT,
    created_at     BIGINT NOT NULL
);
CREATE INDEX messages_chat ON messages(chat_id, id);

CREATE TABLE events (
    id         TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    direction  TEXT NOT NULL,
    channel_id BIGINT,
    chat_id    BIGINT,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX events_chat ON events(chat_id, created_at);

-- One row per outbound request. `seq` orders rows that share an `order_key`:
-- a row waits while an earlier row of its key is still pending.
CREATE TABLE outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    event_id        TEXT NOT NULL,
    kind            TEXT NOT NULL,
    policy          TEXT NOT NULL,
    target_url      TEXT NOT NULL,
    body            TEXT NOT NULL,
    chunked         INTEGER NOT NULL DEFAULT 0,
    order_key       TEXT,
    message_id      BIGINT,
    chat_id         BIGINT,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    give_up_at      BIGINT,
    lease_until     BIGINT,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    finished_at     BIGINT
);
CREATE INDEX outbox_due ON outbox(state, next_attempt_at);
CREATE INDEX outbox_order ON outbox(order_key, state, seq);
