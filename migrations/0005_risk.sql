-- Risk controls of the effect gate: daily spend and count ceilings, and
-- circuits (surge containment and the emergency stop).
--
-- Ceilings are counter rows, one per (workspace, scope, UTC day). A grant
-- charges every scope that has a ceiling in the same statement that grants
-- it, with a conditional upsert (the row lock serialises concurrent grants,
-- so a ceiling admits exactly what fits). The attempt remembers what it was
-- charged and on which day, so reporting it failed releases exactly that,
-- whatever the policy says by then.

-- Scopes: 'type:<effect type>' (daily_budget_micros), 'key:<key id>' (the
-- key's daily_spend_ceiling_micros), 'dim:<effect type>:<dimension>:<keyed
-- hash of the value>' (dimension_limits). cap_* are the ceilings the last
-- charge was checked against, kept on the row so that ON CONFLICT DO UPDATE
-- can test them through excluded.
CREATE TABLE gate_spend (
    workspace_id text NOT NULL REFERENCES workspaces(id),
    scope        text NOT NULL,
    day          date NOT NULL,
    micros       bigint NOT NULL CHECK (micros >= 0),
    count        bigint NOT NULL CHECK (count >= 0),
    cap_micros   bigint,
    cap_count    bigint,
    PRIMARY KEY (workspace_id, scope, day)
);

-- What an execute grant charged: [{scope, micros, count}] on charged_on.
ALTER TABLE effect_attempts ADD COLUMN charges jsonb, ADD COLUMN charged_on date;

-- Breakers, one row per effect type that ever had one; effect_type '*' (never
-- a valid effect type) is the workspace's emergency stop. An open row whose
-- closes_at has passed reads as closed at once; the sweeper makes it durable.
-- allowance_from is where the next surge count starts (the last close), so a
-- closed breaker grants a fresh allowance and is not instantly re-tripped.
CREATE TABLE gate_circuits (
    workspace_id   text NOT NULL REFERENCES workspaces(id),
    effect_type    text NOT NULL,
    state          text NOT NULL CHECK (state IN ('open', 'closed')),
    opened_by      text CHECK (opened_by IN ('surge', 'manual', 'stop')),
    action         text CHECK (action IN ('monitor', 'require_approval', 'deny')),
    reason         text,
    opened_at      timestamptz,
    closes_at      timestamptz,
    allowance_from timestamptz,
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, effect_type)
);
CREATE INDEX gate_circuits_cooling_idx ON gate_circuits (closes_at) WHERE state = 'open';

-- Every effect type a workspace has begun, with when it was first seen (the
-- start of its surge history). Written by begin with ON CONFLICT DO NOTHING.
-- baseline_median caches the learned surge baseline (median hourly volume
-- over 7 days) for the UTC hour baseline_for: it only changes when an hour
-- completes, so begin computes it once an hour, not once a begin.
CREATE TABLE gate_effect_types (
    workspace_id    text NOT NULL REFERENCES workspaces(id),
    effect_type     text NOT NULL,
    first_seen_at   timestamptz NOT NULL,
    baseline_for    timestamptz,
    baseline_median double precision,
    PRIMARY KEY (workspace_id, effect_type)
);
INSERT INTO gate_effect_types (workspace_id, effect_type, first_seen_at)
SELECT workspace_id, effect_type, min(created_at) FROM effects GROUP BY workspace_id, effect_type;

-- Surge volume is counted from the effects themselves (keys first begun in a
-- window), index-only, so begin has no shared hot counter row to contend on.
CREATE INDEX effects_type_created_idx ON effects (workspace_id, effect_type, created_at);

-- gate_refuse aborts the statement that calls it: a grant whose charge does
-- not fit raises, so nothing of it (the effect, the attempt, the other
-- scopes' charges) is kept, and the caller records the denial instead.
CREATE FUNCTION gate_refuse(scope text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ceiling reached' USING ERRCODE = 'RTB01', DETAIL = scope;
END
$$;
