-- Snapshot records (store.SnapshotStore): what each tenant's workspace snapshots are called, what they were
-- taken from and which archive (by digest) holds them. The name is the tenant's own; the quota (how many, and
-- their bytes) is checked in the insert's BEGIN IMMEDIATE transaction.

-- +goose Up
CREATE TABLE snapshots (
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    user_name  TEXT NOT NULL,
    template   TEXT NOT NULL,
    image      TEXT NOT NULL,
    digest     TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE INDEX snapshots_by_digest ON snapshots (digest);

-- +goose Down
DROP TABLE snapshots;
