-- Webhooks: subscriptions, and one delivery row per (subscription, event).
-- Events are fanned out from the outbox (events) by the sweeper; a delivery is
-- claimed with SKIP LOCKED and pushed forward before it is sent, so
-- overlapping sweepers never send the same delivery at the same time.

CREATE TABLE webhooks (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces(id),
    url          text NOT NULL,
    events       text[] NOT NULL,
    -- The signing secret, sealed (aad "<id>/secret"): it must be readable to sign.
    secret       bytea NOT NULL,
    created_at   timestamptz NOT NULL,
    deleted_at   timestamptz
);
CREATE INDEX webhooks_workspace_idx ON webhooks (workspace_id, id) WHERE deleted_at IS NULL;

ALTER TABLE events ADD COLUMN dispatched_at timestamptz;
CREATE INDEX events_undispatched_idx ON events (created_at) WHERE dispatched_at IS NULL;

CREATE TABLE webhook_deliveries (
    id               text PRIMARY KEY,
    webhook_id       text NOT NULL REFERENCES webhooks(id),
    workspace_id     text NOT NULL,
    event_id         text NOT NULL REFERENCES events(id),
    event_type       text NOT NULL,
    state            text NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    last_status_code integer,
    last_error       text,
    created_at       timestamptz NOT NULL,
    delivered_at     timestamptz,
    UNIQUE (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_list_idx ON webhook_deliveries (webhook_id, created_at, id);
