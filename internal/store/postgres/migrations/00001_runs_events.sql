-- Runs and their events. Times are timestamptz, written truncated to milliseconds.

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
    created_at     TIMESTAMPTZ NOT NULL,
    finished_at    TIMESTAMPTZ, -- NULL while running
    CHECK ((status = 'running') = (finished_at IS NULL))
);

CREATE INDEX runs_by_time ON runs (created_at DESC, id DESC);
CREATE INDEX runs_by_owner ON runs (tenant, user_name, created_at DESC);
CREATE INDEX runs_by_status ON runs (status, created_at DESC);

-- event_seq is the one counter event seqs come from. An append increments it in the same statement as its
-- insert, so the row lock orders appenders: seqs become visible in increasing order and a reader polling
-- "after seq N" misses nothing (a plain sequence hands out numbers in one order and commits in another).
CREATE TABLE event_seq (
    one  BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    last BIGINT NOT NULL
);
INSERT INTO event_seq (one, last) VALUES (TRUE, 0);

CREATE TABLE events (
    seq        BIGINT PRIMARY KEY,
    run_id     TEXT REFERENCES runs (id) ON DELETE CASCADE, -- NULL: an event of no run
    time       TIMESTAMPTZ NOT NULL,
    name       TEXT NOT NULL,
    payload    JSON NOT NULL, -- json, not jsonb: the payload reads back byte for byte
    request_id TEXT NOT NULL DEFAULT ''
);

CREATE INDEX events_by_run ON events (run_id, seq);

-- +goose Down
DROP TABLE events;
DROP TABLE event_seq;
DROP TABLE runs;
