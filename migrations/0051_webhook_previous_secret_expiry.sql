-- A rotated secret that has stopped signing is cleared by the sweeper
-- (webhooks.expired_secrets): it should not stay sealed in its row until the
-- next rotation. The sweeper finds those rows through this partial index,
-- which holds only rows with a previous secret, so its pass does not scan
-- every subscription. The table is small (twenty live rows a workspace at
-- most): a plain build holds writes to it for a moment only.
CREATE INDEX IF NOT EXISTS webhooks_previous_secret_expiry_idx ON webhooks (previous_secret_expires_at)
    WHERE previous_secret IS NOT NULL;
