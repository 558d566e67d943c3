-- API tokens of the service. Only a token's SHA-256 (hex) is kept, never the token. Scopes are a text array,
-- which keeps the order they were given in. Times are timestamptz, written truncated to milliseconds.

-- +goose Up
CREATE TABLE tokens (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- creation order, the tie-break of equal created_at
    id         TEXT NOT NULL UNIQUE,
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    name       TEXT NOT NULL CHECK (name <> ''),
    scopes     TEXT[] NOT NULL CHECK (cardinality(scopes) > 0),
    hash       TEXT NOT NULL CHECK (length(hash) = 64),
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ, -- NULL: never
    revoked_at TIMESTAMPTZ  -- NULL: live
);

-- Every request looks its token up by hash.
CREATE UNIQUE INDEX tokens_by_hash ON tokens (hash);
-- A tenant's live tokens have distinct names; a revoked token's name may be used again.
CREATE UNIQUE INDEX tokens_live_name ON tokens (tenant, name) WHERE revoked_at IS NULL;
CREATE INDEX tokens_by_tenant ON tokens (tenant, created_at, seq);

-- +goose Down
DROP TABLE tokens;
