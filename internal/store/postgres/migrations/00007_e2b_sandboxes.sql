-- The E2B front's sandbox records (store.E2BStore): one row per E2B sandbox, from its create to its kill, shared
-- by every replica. The columns are what the store selects on; record is the front's JSON object. version
-- increases at each update (an update names the version it read).

-- +goose Up
CREATE TABLE e2b_sandboxes (
    id         TEXT PRIMARY KEY CHECK (id <> ''),
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    started_at TIMESTAMPTZ NOT NULL,
    end_at     TIMESTAMPTZ NOT NULL,
    paused     BOOLEAN NOT NULL,
    record     JSONB NOT NULL,
    version    BIGINT NOT NULL CHECK (version > 0)
);
CREATE INDEX e2b_sandboxes_by_tenant ON e2b_sandboxes (tenant, started_at, id);

-- +goose Down
DROP TABLE e2b_sandboxes;
