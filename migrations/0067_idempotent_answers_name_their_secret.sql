-- An answer kept for an Idempotency-Key names the resource whose secret it
-- shows: a webhook's create and its rotate-secret answer the signing secret,
-- and the answer is kept, sealed, for 24 hours (lib/idempotency). Since 0065
-- DELETE /api/v1/webhooks/{id} erases the subscription's secrets from its
-- row, but the kept answers still held the secret for up to a day after the
-- delete, and a replay of the create or rotation showed it again.
--
-- resource_id is set when the answer is recorded, in the request's
-- transaction (NULL for an answer that shows no secret), and the delete
-- erases the answers naming the subscription in its transaction, in the
-- statement that follows the one that locks and marks the row (so that a
-- rotation that held the row commits first, its answer seen): answer
-- becomes NULL and status 404, and a replay answers 404 not_found. The
-- partial index finds them; it holds only the answers that still show a
-- secret (the sweeper reads it whole for those of subscriptions deleted by
-- an instance of the previous release, which erases none).
--
-- Answers kept before this migration, or recorded during the deploy by an
-- instance of the previous release, name nothing and are not erased by a
-- delete: they go with their 24 hours (README, Upgrading). The previous
-- release replays an erased answer as a 404 with an empty body. The table
-- holds a day of answers: adding a nullable column without a default
-- rewrites nothing, and the index's build reads the table once and indexes
-- none of its rows yet.
ALTER TABLE idempotent_requests ADD COLUMN IF NOT EXISTS resource_id text;

CREATE INDEX IF NOT EXISTS idempotent_requests_resource_idx ON idempotent_requests (resource_id)
    WHERE resource_id IS NOT NULL AND answer IS NOT NULL;
