-- Leases of a fleet's replicas (store.LeaseStore): who holds a key, who runs the reaper. One row per name, kept
-- after release or expiry so the fencing token only ever increases. Expiry is by the server's clock (now()).

-- +goose Up
CREATE TABLE leases (
    name       TEXT PRIMARY KEY CHECK (name <> ''),
    owner      TEXT NOT NULL CHECK (owner <> ''),
    address    TEXT NOT NULL,
    token      BIGINT NOT NULL CHECK (token > 0),
    expires_at TIMESTAMPTZ NOT NULL
);
-- A replica renews all of its leases in one statement.
CREATE INDEX leases_by_owner ON leases (owner);

-- +goose Down
DROP TABLE leases;
