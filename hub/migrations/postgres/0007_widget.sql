-- The website widget (issue 15): a channel of type `widget` is reached by
-- visitors' browsers through the hub's script instead of an integrator's
-- server. Its `public_id` is the widget id pages embed.
-- (PostgreSQL: the same statements as ../sqlite/0007_widget.sql.)
ALTER TABLE channels ADD COLUMN kind TEXT NOT NULL DEFAULT 'custom';
ALTER TABLE channels ADD COLUMN color TEXT;
-- JSON array of origins allowed to use the widget's endpoints; NULL: any.
ALTER TABLE channels ADD COLUMN allowed_origins TEXT;
-- The widget's callback calls as JSON ({enabled, utc_offset, hours}); NULL: off.
ALTER TABLE channels ADD COLUMN calls TEXT;

-- The visitor's session as the page reports it, per client (one row: the latest).
ALTER TABLE clients ADD COLUMN page_title TEXT;
ALTER TABLE clients ADD COLUMN referrer TEXT;
ALTER TABLE clients ADD COLUMN ip TEXT;
ALTER TABLE clients ADD COLUMN user_agent TEXT;
ALTER TABLE clients ADD COLUMN utm_json TEXT;
-- Country, region and city of the visitor's address (JSON), with a GeoIP database.
ALTER TABLE clients ADD COLUMN geoip_json TEXT;
-- When the visitor last opened a page: a page opened 30 minutes or more
-- after the previous one starts a new visit (`visits_count`).
ALTER TABLE clients ADD COLUMN last_visit_at BIGINT;

-- setClientAttributes calls per visitor and hour (at most 10).
CREATE TABLE widget_attribute_calls (
    client_id BIGINT NOT NULL,
    at        BIGINT NOT NULL
);
CREATE INDEX widget_attribute_calls_client ON widget_attribute_calls(client_id, at);

-- What the page set with setCustomData (an array of fields; the CRM's
-- `custom_data` object is another thing), and where the visitor's history
-- starts after clearHistory.
ALTER TABLE clients ADD COLUMN widget_custom_data TEXT;
ALTER TABLE clients ADD COLUMN history_from BIGINT;
