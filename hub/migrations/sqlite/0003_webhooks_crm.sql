-- Event and CRM webhooks, and the CRM store. Chats' clients are the CRM's
-- clients: the CRM columns extend `clients`. CRM times (`*_ts`) are Unix seconds.

-- Event webhook receiver of each channel; a secret turns on signing.
ALTER TABLE channels ADD COLUMN webhook_url TEXT;
ALTER TABLE channels ADD COLUMN webhook_secret TEXT;

-- Outbox rows of webhooks cross their plugins when first claimed (`staged` = 1),
-- so the plugins' work is outside the transaction that queued them.
ALTER TABLE outbox ADD COLUMN staged INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN secret TEXT;
ALTER TABLE outbox ADD COLUMN response TEXT;

-- What an integrator's reply to chat_accepted / chat_updated showed the agent.
ALTER TABLE chats ADD COLUMN integration TEXT;
ALTER TABLE chats ADD COLUMN rate TEXT;

CREATE TABLE crm_statuses (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    title       TEXT NOT NULL,
    color       TEXT NOT NULL,
    position    INTEGER NOT NULL,
    is_default  INTEGER NOT NULL DEFAULT 0,
    created_at  BIGINT NOT NULL
);
INSERT INTO crm_statuses (title, color, position, is_default, created_at)
VALUES ('New', '#4caf50', 1, 1, 0);

CREATE TABLE crm_organizations (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE crm_tags (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    title      TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

ALTER TABLE clients ADD COLUMN description TEXT;
ALTER TABLE clients ADD COLUMN assigned_agent_id BIGINT;
ALTER TABLE clients ADD COLUMN status_id BIGINT;
ALTER TABLE clients ADD COLUMN organization_id BIGINT;
ALTER TABLE clients ADD COLUMN crm_link TEXT;
-- JSON objects.
ALTER TABLE clients ADD COLUMN custom_data TEXT;
ALTER TABLE clients ADD COLUMN attributes TEXT;
ALTER TABLE clients ADD COLUMN user_token TEXT;
ALTER TABLE clients ADD COLUMN visits_count INTEGER NOT NULL DEFAULT 0;

CREATE TABLE crm_client_tags (
    client_id BIGINT NOT NULL REFERENCES clients(id) ON DELETE CASCADE,
    tag_id    BIGINT NOT NULL REFERENCES crm_tags(id) ON DELETE CASCADE,
    PRIMARY KEY (client_id, tag_id)
);

CREATE TABLE crm_client_contacts (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    client_id    BIGINT NOT NULL REFERENCES clients(id) ON DELETE CASCADE,
    contact_type TEXT NOT NULL,
    contact      TEXT NOT NULL,
    channel_type TEXT NOT NULL,
    UNIQUE (client_id, contact_type, contact)
);

CREATE TABLE crm_blacklist (
    client_id  BIGINT PRIMARY KEY REFERENCES clients(id) ON DELETE CASCADE,
    agent_id   BIGINT NOT NULL,
    block_ts   BIGINT NOT NULL,
    unblock_ts BIGINT NOT NULL,
    ip_address TEXT NOT NULL
);

CREATE TABLE crm_pipelines (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    title      TEXT NOT NULL,
    currency   TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE crm_pipeline_stages (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline_id  BIGINT NOT NULL REFERENCES crm_pipelines(id) ON DELETE CASCADE,
    title        TEXT NOT NULL,
    position     INTEGER NOT NULL,
    color        TEXT NOT NULL,
    stage_type   TEXT NOT NULL,
    final_status TEXT
);

CREATE TABLE crm_reject_reasons (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline_id BIGINT NOT NULL REFERENCES crm_pipelines(id) ON DELETE CASCADE,
    title       TEXT NOT NULL,
    position    INTEGER NOT NULL
);

CREATE TABLE crm_deals (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    client_id         BIGINT NOT NULL REFERENCES clients(id) ON DELETE CASCADE,
    title             TEXT NOT NULL,
    text              TEXT NOT NULL,
    -- The JSON number as written, so 1500 stays 1500.
    amount            TEXT,
    pipeline_id       BIGINT NOT NULL REFERENCES crm_pipelines(id),
    stage_id          BIGINT NOT NULL REFERENCES crm_pipeline_stages(id),
    reject_reason_id  BIGINT REFERENCES crm_reject_reasons(id),
    assigned_agent_id BIGINT,
    creator_agent_id  BIGINT NOT NULL,
    created_ts        BIGINT NOT NULL,
    closed_ts         BIGINT
);
CREATE INDEX crm_deals_client ON crm_deals(client_id);

CREATE TABLE crm_tasks (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    text              TEXT NOT NULL,
    status            TEXT NOT NULL,
    agent_id          BIGINT NOT NULL,
    client_id         BIGINT NOT NULL REFERENCES clients(id) ON DELETE CASCADE,
    deal_id           BIGINT REFERENCES crm_deals(id) ON DELETE SET NULL,
    notify_ts         BIGINT NOT NULL,
    show_notification INTEGER NOT NULL DEFAULT 1,
    creator_agent_id  BIGINT NOT NULL,
    created_ts        BIGINT NOT NULL,
    updated_ts        BIGINT NOT NULL,
    -- Set once the reminder at notify_ts has fired (fired_task sent).
    fired             INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX crm_tasks_due ON crm_tasks(fired, notify_ts);

-- Calls reported by agents, for call_event webhooks.
CREATE TABLE calls (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id     BIGINT REFERENCES chats(id) ON DELETE SET NULL,
    channel_id  BIGINT NOT NULL REFERENCES channels(id) ON DELETE CASCADE,
    client_id   BIGINT REFERENCES clients(id) ON DELETE SET NULL,
    agent_id    BIGINT NOT NULL,
    call_type   TEXT NOT NULL,
    phone       TEXT NOT NULL,
    status      TEXT NOT NULL,
    reason      TEXT,
    record_url  TEXT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);

-- Messages left through the widget's offline form.
CREATE TABLE offline_messages (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    channel_id  BIGINT NOT NULL REFERENCES channels(id) ON DELETE CASCADE,
    client_id   BIGINT REFERENCES clients(id) ON DELETE SET NULL,
    name        TEXT,
    email       TEXT,
    phone       TEXT,
    description TEXT,
    message     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
