-- When a type's reconcile_every_hours was turned on (from null), so that its
-- reminders' calendar starts there: the first reconciliation.due comes one
-- period after the later of this and its last reconciliation. The calendar
-- started at the policy's creation, so turning reminders on for a type whose
-- policy was written long before (every workspace's starter payment.charge)
-- sent the first one at once (QA). Null while reminders are off.
--
-- The policies that have reminders on keep the calendar they had (their
-- creation), so none of them is reminded again for a period already
-- reminded. No CHECK ties the column to reconcile_every_hours: the previous
-- release, still serving during the deploy, writes policies without it (a
-- CHECK failed its PUT turning reminders on); the sweeper reads a missing
-- start as the policy's creation, as before, and the new release dates the
-- start whenever a write turns reminders on from off, whatever a previous
-- release left in the column.
ALTER TABLE gate_policies ADD COLUMN IF NOT EXISTS reconcile_since timestamptz;
UPDATE gate_policies SET reconcile_since = created_at
WHERE reconcile_every_hours IS NOT NULL AND reconcile_since IS NULL;
