-- The bot exchange (issue 14): bots, the chats they hold, and the provider
-- events already applied (de-duplication by the provider's event id).

-- A bot is a provider (`endpoint` + `token`) or a plugin (`plugin`), never both.
-- `provider_id` and `token` are what the provider's URLs to the hub carry.
CREATE TABLE bots (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT NOT NULL UNIQUE,
    provider_id     TEXT NOT NULL UNIQUE,
    endpoint        TEXT,
    token           TEXT,
    plugin          TEXT,
    auth_token_url  TEXT,
    auth_client_id  TEXT,
    auth_secret     TEXT,
    declared        INTEGER NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL
);

-- Channels by name, so a bot may name a channel created later; one bot per channel.
CREATE TABLE bot_channels (
    channel_name TEXT PRIMARY KEY,
    bot_id       BIGINT NOT NULL REFERENCES bots(id) ON DELETE CASCADE
);
CREATE INDEX bot_channels_bot ON bot_channels(bot_id);

-- Where a chat that started with a bot stands: `bot` (the bot holds it),
-- `invited` (waiting for an agent), `unavailable` (waiting, no agent was
-- online: the bot still hears the customer), `joined` (an agent took it),
-- `closed`. The bot is done with the chat in the last two.
CREATE TABLE chat_bots (
    chat_id    BIGINT PRIMARY KEY REFERENCES chats(id) ON DELETE CASCADE,
    bot_id     BIGINT NOT NULL,
    state      TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE bot_events_seen (
    bot_id   BIGINT NOT NULL,
    event_id TEXT NOT NULL,
    seen_at  BIGINT NOT NULL,
    PRIMARY KEY (bot_id, event_id)
);

-- Who wrote a message when the author has no agent row (a bot's name).
ALTER TABLE messages ADD COLUMN author_name TEXT;
