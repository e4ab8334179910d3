-- Plugin key-value namespaces: one row per (plugin, key). Keys in byte order
-- (COLLATE "C"), as SQLite lists them.
CREATE TABLE plugin_kv (
    plugin     TEXT NOT NULL,
    key        TEXT COLLATE "C" NOT NULL,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (plugin, key)
);
