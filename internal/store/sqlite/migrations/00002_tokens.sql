-- API tokens of the service. Only a token's SHA-256 (hex) is kept, never the token. Scopes are a JSON array of
-- strings, so they read back in the order they were given. Times are TEXT in the same fixed-width UTC format
-- as runs.

-- +goose Up
CREATE TABLE tokens (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT, -- creation order, the tie-break of equal created_at
    id         TEXT NOT NULL UNIQUE,
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    name       TEXT NOT NULL CHECK (name <> ''),
    scopes     TEXT NOT NULL CHECK (json_valid(scopes) AND json_type(scopes) = 'array'),
    hash       TEXT NOT NULL CHECK (length(hash) = 64),
    created_at TEXT NOT NULL,
    expires_at TEXT, -- NULL: never
    revoked_at TEXT  -- NULL: live
) STRICT;

-- Every request looks its token up by hash.
CREATE UNIQUE INDEX tokens_by_hash ON tokens (hash);
-- A tenant's live tokens have distinct names; a revoked token's name may be used again.
CREATE UNIQUE INDEX tokens_live_name ON tokens (tenant, name) WHERE revoked_at IS NULL;
CREATE INDEX tokens_by_tenant ON tokens (tenant, created_at, seq);

-- +goose Down
DROP TABLE tokens;
