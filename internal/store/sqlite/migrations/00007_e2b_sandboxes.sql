-- The E2B front's sandbox records (store.E2BStore): one row per E2B sandbox, from its create to its kill. The
-- columns are what the store selects on; record is the front's JSON object. version increases at each update.

-- +goose Up
CREATE TABLE e2b_sandboxes (
    id         TEXT PRIMARY KEY CHECK (id <> ''),
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    started_at TEXT NOT NULL,
    end_at     TEXT NOT NULL,
    paused     INTEGER NOT NULL CHECK (paused IN (0, 1)),
    record     TEXT NOT NULL,
    version    INTEGER NOT NULL CHECK (version > 0)
) STRICT;
CREATE INDEX e2b_sandboxes_by_tenant ON e2b_sandboxes (tenant, started_at, id);

-- +goose Down
DROP TABLE e2b_sandboxes;
