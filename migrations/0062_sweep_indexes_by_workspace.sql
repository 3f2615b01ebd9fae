-- The sweeper's batches take turns among workspaces (lib/db RoundRobin):
-- ordered by due time alone across every workspace, a batch was one
-- workspace's for as long as that workspace had a backlog older than the
-- others' work, and the others waited pass after pass (multi-tenant QA:
-- 100,000 lapsed leases of one workspace, 500 made durable a pass, held
-- another's one lapse, and its effect.indeterminate, back for 200 passes,
-- over three hours on the cron; one workspace's burst of events held every
-- other's webhooks back the same way).
--
-- A fair batch visits each workspace that has work (lib/db
-- WorkspacesWith, one index descent a workspace) and reads each one's
-- earliest due rows; these indexes lead with the workspace for that. Each
-- replaces an index with the same predicate keyed by due time alone, which
-- only these sweeps read (a workspace's own reads, such as listing its
-- indeterminate effects or its runs settling their lapsed last attempts,
-- are served better by the new key): a begin, a claim, a heartbeat and an
-- event write as many index entries as before.
--
--   effects_leased_ws_idx           lapsed leases (effects.lapsed_leases)
--   jobs_lapsed_ws_idx              lapsed job leases (jobs.lapsed_leases)
--   events_undispatched_ws_idx      events to fan out (webhooks.dispatch)
--   effect_groups_unwinding_ws_idx  rollbacks to settle (groups.settle)
--
-- Built inside the migration's transaction, which blocks writes to those
-- four tables while they build (every begin, report, claim, report of a
-- job and event waits; about 5 s for a million effects, the partial
-- indexes being small but the tables read whole), and the drops at its end
-- hold them against reads too until it commits. On large tables build
-- them first with CREATE INDEX CONCURRENTLY under the same names (README,
-- "Upgrading"): IF NOT EXISTS then leaves them be.
CREATE INDEX IF NOT EXISTS effects_leased_ws_idx ON effects (workspace_id, lease_expires_at) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS jobs_lapsed_ws_idx ON jobs (workspace_id, ready_at) WHERE status = 'RUNNING';
CREATE INDEX IF NOT EXISTS events_undispatched_ws_idx ON events (workspace_id, created_at) WHERE dispatched_at IS NULL;
CREATE INDEX IF NOT EXISTS effect_groups_unwinding_ws_idx ON effect_groups (workspace_id, swept_at NULLS FIRST)
    WHERE state = 'unwinding';
DROP INDEX IF EXISTS effects_leased_idx;
DROP INDEX IF EXISTS jobs_lapsed_idx;
DROP INDEX IF EXISTS events_undispatched_idx;
DROP INDEX IF EXISTS effect_groups_unwinding_idx;
