-- Indexes of the dashboard's queries (store.Dashboard): a tenant's runs newest first, and events by name over a
-- time window (refused hosts, recent refusals, latency).

-- +goose Up
CREATE INDEX runs_by_tenant_time ON runs (tenant, created_at DESC, id DESC);
CREATE INDEX events_by_name_time ON events (name, time);
CREATE INDEX events_by_name_seq ON events (name, seq);

-- +goose Down
DROP INDEX events_by_name_seq;
DROP INDEX events_by_name_time;
DROP INDEX runs_by_tenant_time;
