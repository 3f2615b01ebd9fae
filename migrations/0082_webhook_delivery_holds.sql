-- held_until is a claimed delivery's hold: set by each claim (the sweeper's
-- sqlClaim) to the end of its claim's minute, cleared by the record of that
-- claim's send (sqlRecord). The claim counts each webhook's and each
-- workspace's live holds (held_until past the claim's time) as sends in
-- flight, so the bounds of 20 a webhook and 40 a workspace hold across every
-- pass and instance: a claimed delivery was pending, due a minute later, like
-- a scheduled retry, and each pass counted only its own sends (review: 8
-- local passes had up to 160 sends of one webhook in flight). A hold past
-- its time counts as none: a sweeper that stopped mid-send frees its share.
--
-- Nullable, no default: quick, no rewrite. The index is partial, over the
-- held pending rows alone (those in flight, and the few a stopped sweeper
-- left), so counting them reads a handful of rows; it starts empty, but its
-- build reads the table once, blocking deliveries' writes meanwhile (README,
-- Upgrading: on a large table add both first, the index CONCURRENTLY).
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS held_until timestamptz;
CREATE INDEX IF NOT EXISTS webhook_deliveries_held_idx ON webhook_deliveries (held_until, workspace_id, webhook_id)
    WHERE held_until IS NOT NULL AND state = 'pending';
