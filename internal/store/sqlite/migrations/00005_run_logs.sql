-- Run logs (store.RunLogStore): what the driver did for a run and what its setup steps printed, bounded per run
-- (store.RunLogLimit bytes of text, counted in the append's transaction). Removed with their run.

-- +goose Up
CREATE TABLE run_logs (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    time   TEXT NOT NULL,
    source TEXT NOT NULL,
    text   TEXT NOT NULL
);
CREATE INDEX run_logs_by_run ON run_logs (run_id, seq);

-- +goose Down
DROP TABLE run_logs;
