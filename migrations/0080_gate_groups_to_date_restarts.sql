-- A lowering's restart of its type's dating (0078, 0079). A policy write
-- that lowered a type's retention again while the type's groups were still
-- dated in batches went on from after_id, with the lowest retention
-- recorded since: a group the batches had passed, kept longer since by a
-- retention raised in between (a retention pass reaching a group due reads
-- the policies of the day), kept that longer date past the retention
-- lowered to (review). Every write that lowers a retention now dates the
-- type's groups from the first again, by the retention it lowers to
-- (days), and every such restart counts in restarts: a batch that read the
-- record before it moves the record on, or ends it, only while restarts is
-- what it read (days, compared before, can be the same again after a
-- raise and a lowering, and the batch then overwrote the restart). A
-- constant default: no rewrite of the table, quick. During the deploy a
-- previous release's batch compares days still, and can miss a restart
-- recorded meanwhile, as before.
ALTER TABLE gate_groups_to_date
    ADD COLUMN IF NOT EXISTS restarts bigint NOT NULL DEFAULT 0;
