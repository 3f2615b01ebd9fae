-- A deleted subscription keeps no signing secret. Nothing signs with it
-- again (the delete ends its pending deliveries, and a claim passes over
-- deleted subscriptions), so a secret left sealed in its row was only a
-- liability: a reader of the table who also holds RESULT_ENCRYPTION_KEY
-- could sign deliveries its receiver may still accept. DELETE
-- /api/v1/webhooks/{id} now erases secret and previous_secret in the
-- statement that marks the row deleted (lib/webhooks sqlDelete): secret
-- becomes nullable for that, and a CHECK keeps a live subscription's, which
-- every delivery is signed with.
--
-- The secrets of the subscriptions deleted before are erased here. An
-- instance of the previous release still running during the deploy deletes
-- without erasing; the sweeper erases what such a delete left
-- (webhooks.expired_secrets), finding those rows through the partial index
-- below, empty otherwise. The previous release reads a deleted subscription
-- only to answer a DELETE of it again, and a NULL secret opens to nothing
-- there: it answers secret_unreadable false, as this release does. Its
-- claim, like this release's, passes over deleted subscriptions and over
-- any whose secret is not sealed with one of its keys (a NULL one
-- included); its reseal tool reads only secrets that are not NULL.
--
-- The table is small (twenty live rows a workspace at most, and the deleted
-- ones): the update, the CHECK's scan and the index's build hold it for a
-- moment.
ALTER TABLE webhooks ALTER COLUMN secret DROP NOT NULL;

UPDATE webhooks SET secret = NULL, previous_secret = NULL, previous_secret_expires_at = NULL
WHERE deleted_at IS NOT NULL AND (secret IS NOT NULL OR previous_secret IS NOT NULL);

ALTER TABLE webhooks ADD CONSTRAINT webhooks_live_secret CHECK (deleted_at IS NOT NULL OR secret IS NOT NULL);

CREATE INDEX IF NOT EXISTS webhooks_deleted_secret_idx ON webhooks (id)
    WHERE deleted_at IS NOT NULL AND (secret IS NOT NULL OR previous_secret IS NOT NULL);
