-- The agent console (issue 16): agents sign in with e-mail and password and
-- hold a session cookie. Passwords are Argon2id PHC strings; NULL: the agent
-- has no password and can use only its bearer token.
-- (PostgreSQL: the same as ../sqlite/0008_console.sql, with BIGINT for the flag.)
ALTER TABLE agents ADD COLUMN password_hash TEXT;
-- An admin agent may use the admin API with its console session.
ALTER TABLE agents ADD COLUMN admin BIGINT NOT NULL DEFAULT 0;

-- Console sessions: the cookie holds a random id, the table its SHA-256 so a
-- copy of the database signs nobody in. `csrf_token` is sent back by the page
-- on every state-changing request (one per session).
CREATE TABLE console_sessions (
    id_hash     TEXT PRIMARY KEY,
    agent_id    BIGINT NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    csrf_token  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX console_sessions_agent ON console_sessions(agent_id);
CREATE INDEX console_sessions_expiry ON console_sessions(expires_at);
