-- Webhook deliveries are claimed a few per webhook per pass (issue 6 QA:
-- one workspace's backlog for a slow receiver held every other workspace's
-- deliveries behind it). The claim walks each webhook's due deliveries in
-- order through this index.
CREATE INDEX webhook_deliveries_webhook_due_idx ON webhook_deliveries (webhook_id, next_attempt_at)
    WHERE state = 'pending';
