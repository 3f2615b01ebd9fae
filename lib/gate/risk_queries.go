package gate

import "github.com/getratchet/ratchet/lib/events"

// The SQL of the risk controls: daily ceilings (charged with a grant,
// released with a failed report) and circuits. Fragments here are spliced
// into the locked path's grant, resolve and the circuit statements; begin's
// and report's copies live in gate_begin and gate_report (their latest
// bodies: migrations 0020 and 0033),
// so a begin with nothing configured stays one round trip (and skips the
// charge altogether). How begin evaluates the circuits, and what bounds its
// cost, is explained beside gate_evaluate (0008, 0010, 0013, 0020).

// utcDay is the UTC day of a timestamptz expression: ceilings roll at UTC
// midnight whatever the session's time zone.
func utcDay(ts string) string { return `((` + ts + `)::timestamptz AT TIME ZONE 'UTC')::date` }

// chargeCTEs charges an execute grant against every ceiling that applies to
// it. src names a relation with at most one row (the grant) and columns
// workspace_id, effect_type, cost, key_id, key_ceiling, dims (name → keyed
// hash), daily_budget_micros, dimension_limits, day.
//
// plan lists the scopes to charge; chg upserts their counters in scope
// order (one lock order for every charge and release, so no deadlock), each
// only if it still fits under the row lock; refused calls gate_refuse, which
// aborts the whole statement, when any scope did not fit. The caller reads
// refused (so it runs) and records the denial in a new statement. A scope
// with only a count ceiling (a dimension's daily_count) is charged no
// micros: nothing bounds their sum there, and ten grants of 10^18 overflowed
// it, so that every begin charging that scope answered 500 until the day
// rolled (migration 0020); a scope with a micros ceiling (at most 10^18) is
// charged at most that plus one amount (at most 10^18), which fits. The
// attempt records what was charged, so a release gives back exactly that.
// Every grant
// counts 1 towards daily_count, including one that declares no cost at all
// (which is what makes daily_count usable for messaging); an undeclared
// cost is 0 micros.
func chargeCTEs(src string) string { return chargeCTEsExcept(src, "") }

// chargeCTEsExcept is chargeCTEs leaving out the scopes (alias p, with the
// grant s) for which except holds.
func chargeCTEsExcept(src, except string) string {
	if except != "" {
		except = `
    WHERE NOT (` + except + `)`
	}
	return `
plan AS (
    SELECT s.workspace_id, s.day, p.scope, p.label,
        CASE WHEN p.cap_micros IS NULL THEN 0 ELSE coalesce(s.cost, 0) END::bigint AS micros, 1::bigint AS count,
        p.cap_micros, p.cap_count
    FROM ` + src + ` s, LATERAL (` + typeCeiling + `
        UNION ALL
        SELECT 'key:' || s.key_id, 'key', s.key_ceiling, NULL WHERE s.key_ceiling IS NOT NULL
        UNION ALL` + dimensionCeilings + `
    ) p` + except + `
),
chg AS (
    INSERT INTO gate_spend AS g (workspace_id, scope, day, micros, count, cap_micros, cap_count)
    SELECT workspace_id, scope, day, micros, count, cap_micros, cap_count FROM plan
    WHERE (cap_micros IS NULL OR micros <= cap_micros) AND (cap_count IS NULL OR count <= cap_count)
    ORDER BY scope
    ON CONFLICT (workspace_id, scope, day) DO UPDATE
    SET micros = g.micros + excluded.micros, count = g.count + excluded.count,
        cap_micros = excluded.cap_micros, cap_count = excluded.cap_count
    WHERE (excluded.cap_micros IS NULL OR g.micros + excluded.micros <= excluded.cap_micros)
      AND (excluded.cap_count IS NULL OR g.count + excluded.count <= excluded.cap_count)
    RETURNING scope
),
refused AS (
    SELECT gate_refuse(min(label)) AS refused FROM plan WHERE scope NOT IN (SELECT scope FROM chg)
    HAVING count(*) > 0
)`
}

// typeCeiling and dimensionCeilings are the ceilings a type's policy sets
// on a grant s (columns effect_type, dims, daily_budget_micros,
// dimension_limits): its scope, its label (gate_refuse's), and its caps.
// (Their text is also in gate_begin's body, migration 0020.)
const (
	typeCeiling = `
        SELECT 'type:' || s.effect_type AS scope, 'type' AS label, s.daily_budget_micros AS cap_micros,
            NULL::bigint AS cap_count
        WHERE s.daily_budget_micros IS NOT NULL`
	dimensionCeilings = `
        SELECT 'dim:' || s.effect_type || ':' || l.key || ':' || coalesce(s.dims ->> l.key, ''), 'dim:' || l.key,
            (l.value ->> 'daily_micros')::bigint, (l.value ->> 'daily_count')::bigint
        FROM jsonb_each(s.dimension_limits) l
        WHERE l.value ->> 'daily_micros' IS NOT NULL OR l.value ->> 'daily_count' IS NOT NULL`
)

// maxBackfilledCounter bounds a counter sqlChargeEarlierGrants raises
// (numeric: the sum is taken before any bigint could overflow): a day's
// declared spend beyond it (over $8 trillion) is refused, not counted.
const maxBackfilledCounter = "8000000000000000000::numeric"

// sqlChargeEarlierGrants charges the day's earlier grants of a type to the
// ceilings a policy write has just set on it, so that a ceiling set during
// the day bounds the whole day's spend (money QA: a budget set at noon over
// a runaway admitted its whole amount again, as begins under a type with no
// ceiling are charged nothing; one cleared and set again missed what was
// spent meanwhile). Every attempt of the type granted on the UTC day of $3
// and not known to have failed is charged what a grant under the policy
// now written would have been charged (sqlGrant), less what it was charged
// already on each scope: the counters grow by the difference, and each
// attempt records its new charges, so a later failed report or resolution
// releases exactly them. A probe whose earlier attempt of the same day was
// of unknown outcome when it was granted (still, or resolved since: a
// resolution settles both with one outcome) is not charged, as its grant
// would not have been (one of the two acted; stale-read QA: a probe and
// its unknown attempt resolved succeeded were counted twice). An earlier
// attempt that succeeded was so resolved: an effect known to have
// succeeded grants no attempt after it. That is read from the outcome, not
// by comparing the resolution's clock with the probe's grant: a
// reconciliation's clock is read before it waits for the effects' rows,
// and an instance's may lag the granting one's (review: a resolution
// stamped before the probe's grant counted both). The effects
// and their attempts are locked first, in effect id order, then the
// counters in scope order, as a begin,
// a report, a resolve, the lapse sweep and a reconciliation lock them (a
// lock in heap order deadlocked with the sweep, review); a counter may end
// above its cap: that day's later grants are refused. No grant is in
// flight meanwhile: a begin holds the policy's turn shared (sqlLockPolicy),
// so those granted under the policy before have committed. The day's
// attempts of the workspace are found by effect_attempts_started_idx
// (migration 0039), a grant's start being its grant; the day's bounds are
// parameters, not expressions, so that the plan knows how few rows a day
// holds (reckoned from expressions, a ninth of the table, and a hash join
// that read every attempt).
// $1 workspace, $2 effect type, $3 the UTC day's start, $4 the next day's.
var sqlChargeEarlierGrants = `
WITH day AS (
    SELECT ` + utcDay("$3") + ` AS day
), granted AS (
    SELECT a.effect_id, a.attempt, a.charges, e.workspace_id, e.effect_type, e.cost_micros AS cost,
        e.dimensions AS dims, p.daily_budget_micros, p.dimension_limits
    FROM effect_attempts a
    JOIN effects e ON e.id = a.effect_id
    JOIN gate_policies p ON p.workspace_id = e.workspace_id AND p.effect_type = e.effect_type
    WHERE a.workspace_id = $1 AND a.started_at >= $3::timestamptz AND a.started_at < $4::timestamptz
      AND e.effect_type = $2
      AND a.outcome IS DISTINCT FROM 'failed'
      AND NOT (a.probe AND EXISTS (
          SELECT 1 FROM effect_attempts u WHERE u.effect_id = a.effect_id AND u.attempt < a.attempt
            AND u.started_at >= $3::timestamptz
            AND u.outcome IN ('indeterminate', 'succeeded')))
    ORDER BY e.id, a.attempt
    FOR UPDATE OF e, a
), missing AS (
    SELECT s.effect_id, s.attempt, c.scope, c.cap_micros, c.cap_count,
        greatest(w.micros, coalesce(had.micros, 0)) AS micros, greatest(1, coalesce(had.count, 0)) AS count,
        greatest(w.micros - coalesce(had.micros, 0), 0) AS add_micros, greatest(1 - coalesce(had.count, 0), 0) AS add_count
    FROM granted s
    CROSS JOIN LATERAL (` + typeCeiling + `
        UNION ALL` + dimensionCeilings + `
    ) c
    CROSS JOIN LATERAL (SELECT CASE WHEN c.cap_micros IS NULL THEN 0 ELSE coalesce(s.cost, 0) END::bigint AS micros) w
    LEFT JOIN LATERAL (SELECT x.micros, x.count FROM jsonb_to_recordset(s.charges) AS x(scope text, micros bigint, count bigint)
                       WHERE x.scope = c.scope) had ON true
    WHERE (w.micros > coalesce(had.micros, 0) OR had.count IS NULL OR had.count < 1)
      -- a grant made before its dimension was limited may not have declared
      -- it: no counter of the dimension's values holds it (a begin must
      -- declare it now), so it is not charged to one
      AND (c.label = 'type' OR s.dims ? substr(c.label, 5))
), recharges AS (
    -- each attempt's charges: those it had on other scopes, and the new
    SELECT n.effect_id, n.attempt,
        jsonb_agg(jsonb_build_object('scope', n.scope, 'micros', n.micros, 'count', n.count) ORDER BY n.scope) AS charges
    FROM (
        SELECT s.effect_id, s.attempt, x.scope, x.micros, x.count
        FROM granted s, jsonb_to_recordset(s.charges) AS x(scope text, micros bigint, count bigint)
        WHERE EXISTS (SELECT 1 FROM missing m WHERE m.effect_id = s.effect_id AND m.attempt = s.attempt)
          AND NOT EXISTS (SELECT 1 FROM missing m
                          WHERE m.effect_id = s.effect_id AND m.attempt = s.attempt AND m.scope = x.scope)
        UNION ALL
        SELECT m.effect_id, m.attempt, m.scope, m.micros, m.count FROM missing m
    ) n
    GROUP BY n.effect_id, n.attempt
), recharged AS (
    UPDATE effect_attempts a SET charges = r.charges, charged_on = (SELECT day FROM day)
    FROM recharges r WHERE a.effect_id = r.effect_id AND a.attempt = r.attempt
), added AS (
    SELECT m.scope, sum(m.add_micros) AS micros, sum(m.add_count) AS count, min(m.cap_micros) AS cap_micros,
        min(m.cap_count) AS cap_count
    FROM missing m GROUP BY m.scope
), counted AS (
    -- a grant's charge adds up to 10^18 to a counter it finds at most at
    -- its cap (10^18 at most) without leaving bigint; a counter raised this
    -- far above any cap must stay where that still holds, checked on the
    -- row as it is under its lock (review: a check of the snapshot's row
    -- missed what grants added meanwhile)
    INSERT INTO gate_spend AS g (workspace_id, scope, day, micros, count, cap_micros, cap_count)
    SELECT $1, d.scope, (SELECT day FROM day), d.micros, d.count, d.cap_micros, d.cap_count
    FROM added d WHERE d.micros <= ` + maxBackfilledCounter + ` ORDER BY d.scope
    ON CONFLICT (workspace_id, scope, day) DO UPDATE
    SET micros = g.micros + excluded.micros, count = g.count + excluded.count,
        cap_micros = excluded.cap_micros, cap_count = excluded.cap_count
    WHERE g.micros::numeric + excluded.micros <= ` + maxBackfilledCounter + `
    RETURNING g.scope
)
SELECT gate_refuse('overflow') FROM added d WHERE d.scope NOT IN (SELECT scope FROM counted)`

// chargesJSON and chargedOn are what the attempt row records of plan.
const (
	chargesJSON = `(SELECT jsonb_agg(jsonb_build_object('scope', scope, 'micros', micros, 'count', count)
    ORDER BY scope) FROM plan)`
	chargedOn = `(SELECT max(day) FROM plan)`
)

// releaseCTEs gives back what the attempts of src (columns workspace_id,
// charges, charged_on) were charged, on the day they were charged, locking
// the counters in scope order like a charge does (then by day: attempts of
// one effect may have charged different days). src holds at most one row
// per counter and day (freedCTE sums them).
func releaseCTEs(src, where string) string {
	return `
rel_rows AS (
    SELECT g.workspace_id, g.scope, g.day, c.micros, c.count
    FROM ` + src + ` a, jsonb_to_recordset(a.charges) AS c(scope text, micros bigint, count bigint), gate_spend g
    WHERE ` + where + ` AND g.workspace_id = a.workspace_id AND g.scope = c.scope AND g.day = a.charged_on
    ORDER BY g.scope, g.day
    FOR UPDATE OF g
),
rel AS (
    UPDATE gate_spend g SET micros = g.micros - r.micros, count = g.count - r.count
    FROM rel_rows r WHERE g.workspace_id = r.workspace_id AND g.scope = r.scope AND g.day = r.day
)`
}

// freedCTE is the CTE "freed": the charges of src's failed attempts
// (columns workspace_id, charges, charged_on, outcome) summed per counter
// and day, for releaseCTEs. Several attempts may have charged one counter,
// and an UPDATE applies one joined row per target row, so they are summed
// before the release.
func freedCTE(src string) string {
	return `freed AS (
    SELECT c.workspace_id, c.charged_on, jsonb_agg(jsonb_build_object('scope', c.scope, 'micros', c.micros,
        'count', c.count)) AS charges
    FROM (SELECT a.workspace_id, a.charged_on, x.scope, sum(x.micros)::bigint AS micros, sum(x.count)::bigint AS count
          FROM ` + src + ` a, jsonb_to_recordset(a.charges) AS x(scope text, micros bigint, count bigint)
          WHERE a.outcome = 'failed'
          GROUP BY 1, 2, 3) c
    GROUP BY c.workspace_id, c.charged_on
)`
}

// hourUTC truncates a timestamptz expression to its UTC hour.
func hourUTC(ts string) string { return `date_trunc('hour', (` + ts + `)::timestamptz, 'UTC')` }

// baselineSQL is the median hourly volume of an effect type over the last 7
// days: complete UTC hours from its first sighting (at most 7 days back) to
// the hour before now, quiet hours counting as 0. A median, so one runaway
// hour cannot raise the ceiling meant to catch the next. historyFrom is the
// type's gate_effect_history.history_from (the newest effect retention
// deleted, or NULL): the hours up to its hour lost effects, so they are not
// counted as quiet; the window starts after it (migration 0035).
func baselineSQL(ws, typ, now, firstSeen, historyFrom string) string {
	return `(SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY coalesce(n.c, 0)) FILTER (WHERE ` + firstSeen + ` IS NOT NULL)
    FROM generate_series(greatest(` + hourUTC(firstSeen) + `, ` + hourUTC(now) + ` - interval '168 hours',
                                  ` + hourUTC(historyFrom) + ` + interval '1 hour'),
                         ` + hourUTC(now) + ` - interval '1 hour', interval '1 hour') h(hr)
    LEFT JOIN (SELECT ` + hourUTC("x.created_at") + ` AS hr, count(*) AS c FROM effects x
               WHERE x.workspace_id = ` + ws + ` AND x.effect_type = ` + typ + `
                 AND x.created_at >= ` + hourUTC(now) + ` - interval '168 hours' AND x.created_at < ` + hourUTC(now) + `
               GROUP BY 1) n ON n.hr = h.hr)`
}

// volumeSQL counts keys of an effect type first begun after from, as the
// breaker counts them (gate_surge, 0028): with no upper bound, since a key
// stamped a little ahead (another instance's clock, a begin that waited for
// its turn) has been begun all the same.
func volumeSQL(ws, typ, from string) string {
	return `(SELECT count(*) FROM effects x WHERE x.workspace_id = ` + ws + ` AND x.effect_type = ` + typ + `
    AND x.created_at > ` + from + `)`
}

// Surge constants of seed 003: a learned ceiling never drops below 30 and
// waits for 6 hours of history.
const (
	surgeFloor        = `30`
	surgeHistoryHours = `6`
)

// thresholdSQL is the surge threshold of a policy p for a type first seen at
// firstSeen whose baseline is median: surge_per_hour when set, else the
// learned ceiling, NULL while inert or off.
func thresholdSQL(p, now, firstSeen, median string) string {
	return `CASE WHEN ` + p + `.surge_per_hour IS NOT NULL THEN ` + p + `.surge_per_hour::bigint
     WHEN ` + p + `.surge_multiplier IS NOT NULL AND ` + firstSeen + ` <= ` + now + ` - interval '` + surgeHistoryHours + ` hours'
     THEN greatest(` + surgeFloor + `, floor(` + p + `.surge_multiplier * ` + median + `))::bigint END`
}

// sqlListCircuits reads the circuits of every effect type seen (begun),
// configured (a policy) or given a breaker, by type; with $5 set, of that
// one type. $1 workspace, $2 cursor, $3 limit, $4 now, $5 one type (”).
//
// A type's baseline is the one begin cached for the hour
// (gate_effect_types.baseline_for, baseline_median), read as gate_surge
// reads it, when there is one: the same median over the same hours, and
// the one the breaker applies until the hour rolls (computed again, it
// read a week of the type's effects on every list, 0.85 s for 1.4M effects
// of 10 types, scale QA; and it differed from begin's when a retention
// pass had moved the window since). Only a new key's begin under a learned
// ceiling (surge_multiplier without surge_per_hour) caches it, holding the
// type's surge turn; the other types' baselines are computed here.
var sqlListCircuits = `
WITH types AS (
    SELECT effect_type FROM gate_policies WHERE workspace_id = $1
    UNION SELECT effect_type FROM gate_effect_types WHERE workspace_id = $1
    UNION SELECT effect_type FROM gate_circuits WHERE workspace_id = $1 AND effect_type <> '*'
), page AS (
    SELECT $5::text AS effect_type WHERE $5::text <> ''
    UNION ALL
    (SELECT effect_type FROM types WHERE $5::text = '' AND effect_type > $2 ORDER BY effect_type LIMIT $3)
), stop AS (
    SELECT action, reason, opened_at FROM gate_circuits
    WHERE workspace_id = $1 AND effect_type = '*' AND state = 'open'
)
SELECT t.effect_type, c.state = 'open' AND (c.closes_at IS NULL OR c.closes_at > $4), c.opened_by, c.action,
    c.reason, c.opened_at, c.closes_at,
    (SELECT action FROM stop), (SELECT reason FROM stop), (SELECT opened_at FROM stop),
    v.volume, b.median, ` + thresholdSQL("p", "$4::timestamptz", "f.first_seen_at", "b.median") + `
FROM page t
LEFT JOIN gate_circuits c ON c.workspace_id = $1 AND c.effect_type = t.effect_type
LEFT JOIN gate_effect_types f ON f.workspace_id = $1 AND f.effect_type = t.effect_type
LEFT JOIN gate_effect_history h ON h.workspace_id = $1 AND h.effect_type = t.effect_type
LEFT JOIN gate_policies p ON p.workspace_id = $1 AND p.effect_type = t.effect_type
CROSS JOIN LATERAL (SELECT ` + volumeSQL("$1", "t.effect_type", "$4::timestamptz - interval '1 hour'") + ` AS volume) v
-- the baseline once, for its column and the threshold: not pulled up
-- (OFFSET 0), so it is one subplan (scale QA: a type with a learned
-- ceiling read its week of effects twice); the hour's cached one if any
CROSS JOIN LATERAL (SELECT CASE WHEN f.baseline_for = ` + hourUTC("$4") + ` THEN f.baseline_median
    ELSE ` + baselineSQL("$1", "t.effect_type", "$4::timestamptz", "f.first_seen_at", "h.history_from") +
	` END AS median OFFSET 0) b
ORDER BY t.effect_type`

// sqlEmergencyStop reads the emergency stop while it is on (no row when it
// is off). It has no cooldown, so open is on. $1 workspace.
const sqlEmergencyStop = `
SELECT action, reason, opened_at FROM gate_circuits
WHERE workspace_id = $1 AND effect_type = '*' AND state = 'open'`

// sqlDenyingCircuit reads one type's breaker and the stop as
// sqlListCircuits does, without the volume, baseline and threshold (a
// denial's detail needs neither, and a surge is when the volume is
// largest). $1 workspace, $2 type, $3 now.
var sqlDenyingCircuit = `
SELECT $2::text, c.state = 'open' AND (c.closes_at IS NULL OR c.closes_at > $3), c.opened_by, c.action,
    c.reason, c.opened_at, c.closes_at, s.action, s.reason, s.opened_at, 0::bigint, NULL::float8, NULL::bigint
FROM (SELECT) one
LEFT JOIN gate_circuits c ON c.workspace_id = $1 AND c.effect_type = $2
LEFT JOIN gate_circuits s ON s.workspace_id = $1 AND s.effect_type = '*' AND s.state = 'open'`

// sqlLockOpenCircuit locks a type's (or the stop's) breaker while it is
// open, and reads who opened it and its action, for sqlOpenCircuit to tell
// a change from a repeat. $1 workspace, $2 type or '*', $3 now.
const sqlLockOpenCircuit = `
SELECT opened_by, action FROM gate_circuits
WHERE workspace_id = $1 AND effect_type = $2 AND state = 'open' AND (closes_at IS NULL OR closes_at > $3)
FOR UPDATE`

// sqlOpenCircuit opens a breaker by hand (opened_by manual, or stop for the
// '*' row): no cooldown. Re-opening an open one changes its action and
// reason and keeps when it opened. Records circuit.tripped for an opening
// and for every re-opening that changes the opener or the action (QA: a
// stop re-issued with a weaker action changed it silently, and one made
// strict again after that was not announced); a repeat is not announced.
// The event has a surge trip's fields, volume_last_hour and threshold null
// (no count opened it), so receivers read one shape.
// $1 workspace, $2 type or '*', $3 opened_by, $4 action, $5 reason, $6 now,
// $7 event id, $8 and $9 the open breaker's opener and action as
// sqlLockOpenCircuit read them (NULL when it was closed).
var sqlOpenCircuit = `
WITH up AS (
    INSERT INTO gate_circuits AS c (workspace_id, effect_type, state, opened_by, action, reason, opened_at,
        closes_at, allowance_from, updated_at)
    VALUES ($1, $2, 'open', $3, $4, $5, $6, NULL, NULL, $6)
    ON CONFLICT (workspace_id, effect_type) DO UPDATE
    SET state = 'open', opened_by = excluded.opened_by, action = excluded.action, reason = excluded.reason,
        opened_at = CASE WHEN c.state = 'open' AND (c.closes_at IS NULL OR c.closes_at > excluded.opened_at)
                         THEN c.opened_at ELSE excluded.opened_at END,
        closes_at = NULL,
        -- updated_at says when the hold last changed (sqlApprovalsAnswer): a
        -- repeat of an open breaker's action, by its opener or by an
        -- operator taking a surge's breaker over, changes nothing an
        -- approval answered (review and QA: a script re-opening its
        -- breaker every minute, or an operator pinning a surge's, asked
        -- every approval again).
        updated_at = CASE WHEN c.state = 'open' AND (c.closes_at IS NULL OR c.closes_at > excluded.opened_at)
                               AND c.action = excluded.action
                          THEN c.updated_at ELSE excluded.updated_at END
    RETURNING c.opened_at, c.action
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT $7, $1, '` + events.CircuitTripped + `', $2,
        jsonb_build_object('effect_type', CASE WHEN $2::text <> '*' THEN $2::text END, 'opened_by', $3::text,
            'action', up.action, 'opened_at', up.opened_at, 'closes_at', NULL,
            'volume_last_hour', NULL, 'threshold', NULL), $6,
        $3::text || ':' || extract(epoch FROM up.opened_at)::text || ':' || up.action || ':' || $7::text
    FROM up
    WHERE $8::text IS DISTINCT FROM $3::text OR $9::text IS DISTINCT FROM up.action
    -- Every event here is a transition of its own: opens and closes of a
    -- breaker take its turn (sqlLockCircuitTurn) and read the change under
    -- it, so none repeats another, and each has a key of its own. Keyed by
    -- when the breaker opened alone, an opening whose clock read the
    -- instant an earlier one of the breaker read (another instance's,
    -- lagging by the time between them) took its key and was not
    -- announced (concurrency QA).
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
)
SELECT count(*) FROM up`

// closeSQL is closeCTEs answering how many breakers it closed.
func closeSQL(cand, now, eventIDs string) string {
	return closeCTEs(cand, now, eventIDs) + `SELECT count(*) FROM up`
}

// closeCTEs close the open breakers of cand (workspace_id, effect_type),
// measuring the next surge allowance from when each closed (its cooldown's
// end if that came first), and record circuit.closed for each (eventIDs is
// the event id array parameter, now the clock reading); up holds the rows
// closed.
//
// Each close's event has a key of its own: when its breaker opened, and
// its event id. A close is a transition of the row (open to closed) made
// under its lock: a racer closing the same breaker waits for the lock and
// finds it closed (cand re-reads a locked row, and the update checks it is
// still open), so it closes nothing and records nothing; no two events
// here are one close. Keyed by when the breaker opened alone, a surge
// breaker re-opened at the instant an earlier one of it opened took the
// earlier close's key when it closed, and was not announced (concurrency
// QA). Instances' clocks lag, and a trip's reading is moved only past the
// start of the allowance it is counted in (afterAllowanceSQL), which a
// policy's close read by a lagging clock puts before that instant. (Every
// trip is moved so: a begin counts the surge only in the surge turn, as a
// PUT turning surge on cannot land between its two reads of the policy,
// sqlBeginFast; the keys do not rely on it.) gate_begin_in_turn holds
// this text (migration 0070).
func closeCTEs(cand, now, eventIDs string) string {
	return closeCTEsFrom(cand, now, now, "n.allowance_from", eventIDs)
}

// closeCTEsFrom is closeCTEs measuring the allowance of a breaker closed
// before its cooldown ended (or that has none) from from, a time at or
// after now (closeFromSQL), its event's closed_at being closedAt (an
// expression over n, the row closed).
func closeCTEsFrom(cand, now, from, closedAt, eventIDs string) string {
	return `
WITH cand AS (` + cand + `), up AS (
    UPDATE gate_circuits c SET state = 'closed', updated_at = ` + now + `,
        allowance_from = CASE WHEN c.closes_at <= ` + now + ` THEN c.closes_at ELSE ` + from + ` END
    FROM cand WHERE c.workspace_id = cand.workspace_id AND c.effect_type = cand.effect_type AND c.state = 'open'
    RETURNING c.workspace_id, c.effect_type, c.opened_by, c.opened_at, c.allowance_from
), n AS (
    SELECT up.*, row_number() OVER (ORDER BY up.workspace_id, up.effect_type) AS i FROM up
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT (` + eventIDs + `::text[])[n.i], n.workspace_id, '` + events.CircuitClosed + `', n.effect_type,
        jsonb_build_object('effect_type', CASE WHEN n.effect_type <> '*' THEN n.effect_type END,
            'opened_by', n.opened_by, 'opened_at', n.opened_at, 'closed_at', ` + closedAt + `), ` + now + `,
        'closed:' || extract(epoch FROM n.opened_at)::text || ':' || (` + eventIDs + `::text[])[n.i]
    FROM n
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
)
`
}

// closeFromSQL is when the fresh allowance of the breaker c that an
// operator (or a policy turning surge off) closes at now starts: now, or,
// when a key of its type was stamped later (begun through an instance whose
// clock is ahead of the closing one's), that key's stamp, created or
// arrived (the surge counts both, gate_surge). The close holds the type's
// surge turn, so every key stamped so far was begun while the breaker was
// open, and the keys begun after the close are stamped after the start
// (afterAllowanceSQL): measured from a lagging clock, the allowance counted
// the burst the breaker had just refused, and the close granted nothing
// (QA: a burst through an instance a second ahead, closed through another,
// and the next begin was refused again). Instances read the database's
// clock (db.Clock), so what is left is a few milliseconds, or a test's
// clocks; a key stamped more than closeAheadAtMost past now is not
// followed: every begin after the close is stamped after the start, its
// lease with it, and one key stamped far ahead (by a release before
// db.Clock, say) would have carried them all there.
func closeFromSQL(now string) string {
	bound := `(` + now + ` + interval '` + closeAheadAtMost + `')`
	return `greatest(` + now + `,
            (SELECT max(x.created_at) FROM effects x WHERE x.workspace_id = c.workspace_id AND x.effect_type = c.effect_type
               AND x.created_at <= ` + bound + `),
            (SELECT max(x.surge_arrived_at) FROM effects x
             WHERE x.workspace_id = c.workspace_id AND x.effect_type = c.effect_type AND x.surge_arrived_at <= ` + bound + `))`
}

// closeAheadAtMost bounds how far past a close's clock the start of its
// allowance follows a key's stamp (closeFromSQL): db.Clock's readings are
// at most a minute old (clockRefresh).
const closeAheadAtMost = "1 minute"

// closedAtSQL is the closed_at of the circuit.closed of a close at now
// measured from closeFromSQL: when it closed (its cooldown's end, when that
// came first), not when its allowance starts.
func closedAtSQL(now string) string { return `least(n.allowance_from, ` + now + `)` }

// lapsedCloseSQL closes the breaker of workspace $1's type $2 if its
// cooldown ended by now: a breaker reads closed from then (gate_evaluate),
// but only the sweeper recorded it closed, so a trip or an operator's open
// before the sweeper's next pass reopened the row without a circuit.closed.
// gate_begin_in_turn (migration 0070) holds this text with now = v_now.
func lapsedCloseSQL(now, eventIDs string) string {
	return closeSQL(lapsedSQL(now), now, eventIDs)
}

// lapsedSQL locks the breaker of workspace $1's type $2 if it is open and
// its cooldown ended by now (lapsedCloseSQL's candidates).
func lapsedSQL(now string) string {
	return `SELECT workspace_id, effect_type FROM gate_circuits
    WHERE workspace_id = $1 AND effect_type = $2 AND state = 'open' AND closes_at <= ` + now + `
    FOR UPDATE`
}

// surgeTurn is the advisory lock key of workspace ws's type typ's surge
// turn (gate_begin_in_turn, migration 0025, takes the same).
func surgeTurn(ws, typ string) string {
	return `hashtextextended('surge:' || ` + ws + ` || ':' || ` + typ + `, 0)`
}

// afterAllowanceSQL is now, a clock reading of a begin that holds workspace
// $1's type $2's surge turn, or just after the start of the type's surge
// allowance when now is not after it. Closes take the turn, so the begin
// reads the allowance it is counted in; the close's clock (another
// instance's, the sweeper's, or the cooldown's end) may be ahead of the
// begin's reading, which was also taken before the request waited for
// the turn. The surge counts keys stamped after the allowance's start, so
// a begin stamped at or before it, decided after the close, was granted
// and then counted by no later begin: every such begin executed (race QA:
// two instances' burst at a cooldown's end gave 6 execute against 5, and
// the sweeper closing just ahead of the begins' clocks 5 of 5 against 2).
// after is just after the allowance's start: allowanceAfterSQL, or, in a
// statement that may close the breaker itself, the start that close set.
// gate_begin_in_turn (migration 0070) holds this text with now = v_now and
// after = allowanceAfterSQL, for every begin, in the turn or not: one of a
// type that counts no surge is stamped after the start too, so that a
// policy turning surge on counts it (a lagging instance's key begun after
// the close was counted by none).
func afterAllowanceSQL(now, after string) string {
	return `greatest(` + now + `, ` + after + `)`
}

// allowanceAfterSQL is just after the start of workspace $1's type $2's
// surge allowance, as its breaker's row holds it (NULL: no row).
const allowanceAfterSQL = `(SELECT c.allowance_from + interval '1 microsecond' FROM gate_circuits c
    WHERE c.workspace_id = $1 AND c.effect_type = $2)`

var (
	// sqlCloseLapsedCircuit is lapsedCloseSQL for the operator's open.
	// $1 workspace, $2 type, $3 now, $4 event ids.
	sqlCloseLapsedCircuit = lapsedCloseSQL("$3::timestamptz", "$4")
	// sqlCloseCircuit closes one breaker ('*' lifts the stop), its
	// allowance measured from closeFromSQL. $1 workspace, $2 type or '*',
	// $3 now, $4 event ids.
	sqlCloseCircuit = closeCTEsFrom(`SELECT $1::text AS workspace_id, $2::text AS effect_type`, "$3::timestamptz",
		closeFromSQL("$3::timestamptz"), closedAtSQL("$3::timestamptz"), "$4") + `SELECT count(*) FROM up`
	// sqlLockSurgeTurn takes a type's surge turn, as gate_begin_in_turn
	// does (migration 0028). $1 workspace, $2 type.
	sqlLockSurgeTurn = `SELECT pg_advisory_xact_lock(` + surgeTurn("$1::text", "$2::text") + `)`
	// sqlCloseLapsedForArrival is lapsedCloseSQL for an arrival holding
	// its type's surge turn, answering the arrival's clock reading $3 moved
	// after the start of the allowance it is counted in (afterAllowanceSQL):
	// the start this close set, read from its own update (the statement's
	// snapshot predates it), else the row's. One statement: every other
	// begin of the type waits for this turn, so each round trip in it is
	// theirs too. $1 workspace, $2 type, $3 now, $4 event ids.
	sqlCloseLapsedForArrival = closeCTEs(lapsedSQL("$3::timestamptz"), "$3::timestamptz", "$4") + `SELECT ` +
		afterAllowanceSQL("$3::timestamptz",
			`coalesce((SELECT u.allowance_from + interval '1 microsecond' FROM up u), `+allowanceAfterSQL+`)`)
	// sqlLockCircuitTurn takes a type's (or the stop's, '*') turn among an
	// operator's opens and closes, first in each, so that each answers the
	// state it made: a close finding the breaker closed changes no row and
	// locks none, and an open committing before its answer was read made it
	// answer "open" (race QA). $1 workspace, $2 type or '*'.
	sqlLockCircuitTurn = `SELECT pg_advisory_xact_lock(hashtextextended('circuit:' || $1::text || ':' || $2::text, 0))`
	// sqlCloseSurgeCircuit closes a type's breaker if the surge opened it:
	// the policy PUT that turns surge off. $1 workspace, $2 type, $3 now,
	// $4 event ids.
	sqlCloseSurgeCircuit = closeCTEsFrom(`SELECT workspace_id, effect_type FROM gate_circuits
    WHERE workspace_id = $1 AND effect_type = $2 AND state = 'open' AND opened_by = 'surge' FOR UPDATE`,
		"$3::timestamptz", closeFromSQL("$3::timestamptz"), closedAtSQL("$3::timestamptz"), "$4") +
		`SELECT count(*) FROM up`
	// sqlRetuneSurgeCircuit gives a breaker the surge opened, still open,
	// the action the policy PUT has just set, and records circuit.tripped
	// with it, as a re-issued stop does: it went on holding with the action
	// it tripped with until a new key's begin tripped it again, so a
	// monitor breaker made deny let every retry through meanwhile (QA).
	// $1 workspace, $2 type, $3 action, $4 now, $5 event id.
	sqlRetuneSurgeCircuit = `
WITH up AS (
    UPDATE gate_circuits SET action = $3, updated_at = $4
    WHERE workspace_id = $1 AND effect_type = $2 AND state = 'open' AND opened_by = 'surge'
      AND (closes_at IS NULL OR closes_at > $4) AND action <> $3
    RETURNING opened_at, closes_at, action
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT $5, $1, '` + events.CircuitTripped + `', $2,
        jsonb_build_object('effect_type', $2::text, 'opened_by', 'surge', 'action', up.action,
            'opened_at', up.opened_at, 'closes_at', up.closes_at, 'volume_last_hour', NULL, 'threshold', NULL), $4,
        'surge:' || extract(epoch FROM up.opened_at)::text || ':' || up.action || ':' || $5::text
    FROM up
)
SELECT count(*) FROM up`
	// sqlSweepCircuits closes surge breakers whose cooldown has passed,
	// each in its type's surge turn, as every close is (close): a type
	// whose turn is held is left to the holder (a begin that counts the
	// surge closes a lapsed breaker first) or to the next pass. Tried, not
	// waited for: a begin holds the turn, then waits for the breaker's row,
	// which the sweep locks first. The pass takes turns among the
	// workspaces with breakers to close, each one's longest cooled first
	// (as db.RoundRobin orders), so one workspace's many breakers hold no
	// other's circuit.closed back (multi-tenant QA). $1 now, $2 limit, $3
	// event ids.
	sqlSweepCircuits = closeSQL(`SELECT workspace_id, effect_type FROM (
    SELECT workspace_id, effect_type FROM gate_circuits
    WHERE state = 'open' AND closes_at <= $1 AND (workspace_id, effect_type) IN (
        SELECT workspace_id, effect_type FROM (
            SELECT workspace_id, effect_type, closes_at,
                row_number() OVER (PARTITION BY workspace_id ORDER BY closes_at, effect_type) AS turn
            FROM gate_circuits WHERE state = 'open' AND closes_at <= $1) t
        ORDER BY turn, closes_at, workspace_id, effect_type LIMIT $2)
    FOR UPDATE SKIP LOCKED) due
    WHERE pg_try_advisory_xact_lock(`+surgeTurn("workspace_id", "effect_type")+`)`,
		"$1::timestamptz", "$3")
)

// A key a breaker refused before it was ever granted (or a refusal before
// the breaker's, arrivalDenials) is the surge's arrival when it is next
// begun (migrations 0040, 0076): begin's locked path counts it as
// gate_begin counts a new key.
const (
	// sqlEvaluateArrival is gate_evaluate for the arrival, with the surge's
	// count and whether it trips (gate_begin_locked's evaluation counts it
	// too, but answers only its verdict). $1 workspace, $2 type, $3 key,
	// $4 cost, $5 declared dimensions, $6 requested lease, $7 now.
	sqlEvaluateArrival = `SELECT on_indeterminate, max_attempts, max_cost_micros, approval_above_micros, precheck,
    missing_dimensions, fresh, approval_reason, eff_lease, surge_action, surge_cooldown_seconds, surge_trips,
    surge_volume, surge_threshold
FROM gate_evaluate($1::text, $2::text, $3::text, $4::bigint, $5::text[], $6::int, $7::timestamptz)`
	// sqlRecordArrival records effect $1's arrival at $2: gate_surge counts
	// it from then, as a new key from its creation.
	sqlRecordArrival = `UPDATE effects SET surge_arrived_at = $2::timestamptz WHERE id = $1::text`
)

var (
	// sqlTripSurge is surgeTripSQL for an arrival. $1 workspace, $2 type,
	// $3 action, $4 now, $5 cooldown seconds, $6 volume, $7 threshold,
	// $8 event id.
	sqlTripSurge = surgeTripSQL("$1::text", "$2::text", "$3::text", "$4::timestamptz", "$5::int", "$6::bigint",
		"$7::bigint", "$8::text")
)

// surgeTripSQL opens type typ's breaker for a surge that went over its
// threshold, or raises the action of a weaker breaker the surge opened (a
// breaker opened by hand is left as set), and records circuit.tripped with
// the count that tripped it. gate_begin (migration 0069) holds this text
// for a new key, with its own names (FunctionFragments), indented as it is
// there.
//
// Each trip's event has a key of its own: when the breaker opened, its
// action, and its event id. A trip records an event only when its upsert
// changed the row (opened it, or raised its action), under the row's
// lock: a racer tripping the same surge waits for the lock and finds the
// breaker open with the action it brings, or a stronger one (the update's
// WHERE), so it changes nothing and records nothing; no two events here
// are one trip. Keyed by when the breaker opened (and the action of a
// raise), a breaker re-opened at the instant an earlier one of it opened
// (as clocks that lag can: closeCTEs) took the earlier trip's key and was
// not announced (concurrency QA).
func surgeTripSQL(ws, typ, action, now, cooldown, volume, threshold, eventID string) string {
	return `WITH trip AS (
                INSERT INTO gate_circuits AS c (workspace_id, effect_type, state, opened_by, action, reason, opened_at,
                    closes_at, allowance_from, updated_at)
                VALUES (` + ws + `, ` + typ + `, 'open', 'surge', ` + action + `, NULL, ` + now + `,
                    ` + now + `::timestamptz + make_interval(secs => ` + cooldown + `), NULL, ` + now + `)
                ON CONFLICT (workspace_id, effect_type) DO UPDATE
                SET state = 'open', opened_by = 'surge', action = excluded.action,
                    reason = CASE WHEN c.state = 'closed' OR c.closes_at <= excluded.opened_at THEN NULL ELSE c.reason END,
                    opened_at = CASE WHEN c.state = 'closed' OR c.closes_at <= excluded.opened_at
                                     THEN excluded.opened_at ELSE c.opened_at END,
                    closes_at = CASE WHEN c.state = 'closed' OR c.closes_at <= excluded.opened_at
                                     THEN excluded.closes_at ELSE c.closes_at END,
                    updated_at = excluded.updated_at
                WHERE c.state = 'closed' OR c.closes_at <= excluded.opened_at
                   OR (c.opened_by = 'surge' AND array_position(ARRAY['monitor', 'require_approval', 'deny'], c.action)
                                                 < array_position(ARRAY['monitor', 'require_approval', 'deny'], excluded.action))
                RETURNING c.action, c.opened_at, c.closes_at
            )
            INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
            SELECT ` + eventID + `, ` + ws + `, '` + events.CircuitTripped + `', ` + typ + `,
                jsonb_build_object('effect_type', ` + typ + `::text, 'opened_by', 'surge', 'action', trip.action,
                    'volume_last_hour', ` + volume + `, 'threshold', ` + threshold + `, 'opened_at', trip.opened_at,
                    'closes_at', trip.closes_at), ` + now + `,
                'surge:' || extract(epoch FROM trip.opened_at)::text || ':' || trip.action || ':' || ` + eventID + `
            FROM trip
            ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING`
}

// sqlPruneSpend deletes counters of days no grant can be charged to any
// more; a failure reported later than that releases nothing. They are
// found, oldest day first, by gate_spend_day_idx (migration 0055) and
// deleted by the row addresses the same statement locked, so a pass reads
// the counters it deletes, not the table: found by a scan of it (the
// primary key leads with the workspace) and deleted through a join, a pass
// read every counter even when none was due (scale QA: 300k counters, none
// due, 2.8k buffers on every pass instead of 3).
// $1 oldest day kept ('YYYY-MM-DD'), $2 limit.
const sqlPruneSpend = `DELETE FROM gate_spend WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM gate_spend WHERE day < $1::date ORDER BY day LIMIT $2
    FOR UPDATE SKIP LOCKED))`

// sqlStructuring measures how declared costs of a type sit against its
// watch line: the policy's structuring_threshold_micros, else its
// max_cost_micros (seed 003). One scan of the type's last 7 days by
// effects_type_created_idx; a row of the last 24 hours counts in both
// windows. Bands are fractions of the line, compared in numeric so that no
// product overflows. $1 workspace, $2 type, $3 now.
const sqlStructuring = `
WITH pol AS (` + sqlEffectivePolicy + `),
line AS (
    SELECT coalesce(structuring_threshold_micros, max_cost_micros) AS micros,
           CASE WHEN structuring_threshold_micros IS NOT NULL THEN 'structuring_threshold_micros'
                WHEN max_cost_micros IS NOT NULL THEN 'max_cost_micros' END AS source
    FROM pol
)
SELECT line.micros, line.source, w.hours, count(e.cost_micros),
       count(*) FILTER (WHERE e.cost_micros::numeric < line.micros * 0.8),
       count(*) FILTER (WHERE e.cost_micros::numeric >= line.micros * 0.8 AND e.cost_micros::numeric < line.micros * 0.9),
       count(*) FILTER (WHERE e.cost_micros::numeric >= line.micros * 0.9 AND e.cost_micros < line.micros),
       count(*) FILTER (WHERE e.cost_micros >= line.micros)
FROM line
LEFT JOIN effects e ON e.workspace_id = $1 AND e.effect_type = $2 AND e.cost_micros IS NOT NULL
    AND e.created_at > $3::timestamptz - interval '168 hours' AND e.created_at <= $3::timestamptz
LEFT JOIN LATERAL (
    SELECT 168 WHERE e.id IS NOT NULL
    UNION ALL
    SELECT 24 WHERE e.created_at > $3::timestamptz - interval '24 hours'
) w(hours) ON true
GROUP BY line.micros, line.source, w.hours`
