-- Runs and their events. Times are TEXT in one fixed-width UTC format with milliseconds
-- (2006-01-02T15:04:05.000Z), so comparing the text compares the times.

-- +goose Up
CREATE TABLE runs (
    id             TEXT PRIMARY KEY,
    tenant         TEXT NOT NULL,
    user_name      TEXT NOT NULL,
    trust          TEXT NOT NULL CHECK (trust IN ('trusted', 'untrusted')),
    requested_mode TEXT NOT NULL,
    resolved_mode  TEXT NOT NULL,
    source         TEXT NOT NULL,
    driver         TEXT NOT NULL,
    admission      TEXT NOT NULL CHECK (admission IN ('admitted', 'refused')),
    status         TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'failed_resumable')),
    failure_code   TEXT NOT NULL DEFAULT '',
    disposition    TEXT NOT NULL DEFAULT '' CHECK (disposition IN ('', 'deterministic', 'infrastructure')),
    created_at     TEXT NOT NULL,
    finished_at    TEXT, -- NULL while running
    CHECK ((status = 'running') = (finished_at IS NULL))
) STRICT;

CREATE INDEX runs_by_time ON runs (created_at DESC, id DESC);
CREATE INDEX runs_by_owner ON runs (tenant, user_name, created_at DESC);
CREATE INDEX runs_by_status ON runs (status, created_at DESC);

-- AUTOINCREMENT: a seq is never reused, even after the newest events are deleted. Writers are serialized by
-- SQLite's write lock, so seqs become visible in increasing order.
CREATE TABLE events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     TEXT REFERENCES runs (id) ON DELETE CASCADE, -- NULL: an event of no run
    time       TEXT NOT NULL,
    name       TEXT NOT NULL,
    payload    TEXT NOT NULL CHECK (json_valid(payload)),
    request_id TEXT NOT NULL DEFAULT ''
) STRICT;

CREATE INDEX events_by_run ON events (run_id, seq);

-- +goose Down
DROP TABLE events;
DROP TABLE runs;
