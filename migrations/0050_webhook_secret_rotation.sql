-- A subscription's signing secret can be rotated (POST
-- /api/v1/webhooks/{id}/rotate-secret): the previous secret keeps signing
-- deliveries, beside the new one (a second v1 in Ratchet-Signature), until
-- previous_secret_expires_at, so that a receiver can take the new secret
-- without refusing a delivery meanwhile. It is sealed as secret is, under
-- the same associated data: the ciphertext moves from one column to the
-- other. Nullable columns without a default: no table rewrite; the previous
-- release reads neither.
ALTER TABLE webhooks
    ADD COLUMN previous_secret bytea,
    ADD COLUMN previous_secret_expires_at timestamptz;
