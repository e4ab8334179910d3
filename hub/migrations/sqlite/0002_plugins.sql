-- Plugin key-value namespaces: one row per (plugin, key).
CREATE TABLE plugin_kv (
    plugin     TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (plugin, key)
);
