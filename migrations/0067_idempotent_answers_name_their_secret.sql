-- An answer kept for an Idempotency-Key names the resource whose secret it
-- shows: a webhook's create and its rotate-secret answer the signing secret,
-- and the answer is kept, sealed, for 24 hours (lib/idempotency). Since 0065
-- DELETE /api/v1/webhooks/{id} erases the subscription's secrets from its
-- row, but the kept answers still held the secret for up to a day after the
-- delete, and a replay of the create or rotation showed it again.
--
-- resource_id is set when the answer is recorded, in the request's
-- transaction ('' for an answer that shows no secret), and the delete
-- erases the answers naming the subscription in its transaction, in the
-- statement that follows the one that locks and marks the row (so that a
-- rotation that held the row commits first, its answer seen): answer
-- becomes NULL and status 404, and a replay answers 404 not_found.
-- idempotent_requests_resource_idx finds them: it holds only the answers
-- that still show a secret (the sweeper also reads it whole for those of
-- subscriptions deleted by an instance of the previous release, which
-- erases none).
--
-- The answers kept before this migration, and those an instance of the
-- previous release records during the deploy, name nothing (NULL): the
-- sweeper (idempotency.link_secrets) opens them, oldest first, through
-- idempotent_requests_unlinked_idx, links each to the subscription whose
-- secret it shows ('' when none), and erases those of subscriptions
-- deleted already (webhooks.expired_secrets). The previous release
-- replays an erased answer as a 404 with an empty body. The table holds a
-- day of answers: adding a nullable column without a default rewrites
-- nothing, and each index's build reads the table once.
ALTER TABLE idempotent_requests ADD COLUMN IF NOT EXISTS resource_id text;

CREATE INDEX IF NOT EXISTS idempotent_requests_resource_idx ON idempotent_requests (resource_id)
    WHERE resource_id <> '' AND answer IS NOT NULL;

CREATE INDEX IF NOT EXISTS idempotent_requests_unlinked_idx ON idempotent_requests (created_at)
    WHERE resource_id IS NULL AND answer IS NOT NULL;
