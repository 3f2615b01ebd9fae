-- Answers of creates sent with an Idempotency-Key header (lib/idempotency):
-- keys, webhooks, contracts, tool tests and worker registrations have no
-- idempotency key of their own, so a client whose answer was lost (a
-- timeout, a dropped connection) and that sent the request again made a
-- second key, a second webhook (every event delivered twice), a second
-- contract version. With the header, the first request's answer is kept for
-- 24 hours and given again to the same request from the same API key.
--
-- A row is claimed by the request acting under it (request_id, its
-- X-Request-Id, which a replay names in Original-Request; claimed_until)
-- and answered when it succeeded (status, answer,
-- sealed: a new key's or webhook's secret is in it); a request refused
-- before it acted deletes its claim, so the corrected request may use the
-- key. A claim whose request died, or failed with an unknown outcome, is
-- taken over after claimed_until. Keys are per API key, never per
-- workspace: another key of the workspace cannot read an answer through
-- them. The sweeper deletes rows a day old (idempotent_requests_created_idx).
CREATE TABLE IF NOT EXISTS idempotent_requests (
    key_id          text NOT NULL,
    idempotency_key text NOT NULL,
    request_hash    bytea NOT NULL,
    request_id      text NOT NULL,
    claimed_until   timestamptz,
    status          integer,
    answer          bytea,
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (key_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS idempotent_requests_created_idx ON idempotent_requests (created_at);
