-- Notices between hub instances on one PostgreSQL database (live updates,
-- bots changed): PostgreSQL's NOTIFY carries at most 8000 bytes, so a larger
-- notice is kept here for a few minutes and NOTIFY names its id. SQLite has
-- one instance and never writes here; the table keeps both schemas alike.
CREATE TABLE hub_notices (
    id          INTEGER PRIMARY KEY,
    payload     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX hub_notices_created ON hub_notices(created_at);
