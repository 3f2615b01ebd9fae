-- A subscription can be disabled and enabled again, and its URL and event
-- types changed, without deleting it (PATCH /api/v1/webhooks/{id}): a
-- delete loses its delivery history and the secret its receiver holds.
--
-- disabled_at is when the subscription was disabled, NULL while it is
-- enabled. While disabled, its pending deliveries are held (the claim
-- passes over them, their attempts untouched) and the events recorded from
-- disabled_at on are not fanned out to it; they are skipped, as Stripe
-- skips a disabled endpoint's events.
--
-- last_disabled is the last period it was disabled, [disabled_at, enabled
-- again), kept once it is enabled again: an event recorded in it but
-- fanned out only after the subscription was enabled again (fan-out trails
-- an event by up to a sweep) is skipped too. An earlier period is
-- forgotten: an event of it still not fanned out is sent.
--
-- Nullable columns without a default: no table rewrite. The previous
-- release reads neither: an instance of it still sweeping sends a disabled
-- subscription's deliveries until it is replaced.
ALTER TABLE webhooks
    ADD COLUMN disabled_at timestamptz,
    ADD COLUMN last_disabled tstzrange;
