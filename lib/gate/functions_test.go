package gate_test

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
)

// The hot statements run as PL/pgSQL functions (migrations 0008, 0010) so
// that the pool's default exec mode does not plan them on every call, and
// each forces its cached generic plan (0010): left to choose, Postgres
// re-planned the large ones on every call.
func TestGateFunctionsExist(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.env.App.Pool.Query(context.Background(), `
SELECT p.proname, l.lanname, p.provolatile::text, p.prosecdef,
    EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%'),
    'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.proname IN ('gate_evaluate', 'gate_surge', 'gate_begin', 'gate_begin_in_turn', 'gate_begin_locked', 'gate_report',
                    'gate_heartbeat')
  AND p.pronamespace = to_regnamespace(current_schema())
  -- the previous release's forms of gate_report (0026) and gate_begin_in_turn (0028)
  AND NOT (p.proname = 'gate_report' AND p.pronargs = 8)
  AND NOT (p.proname = 'gate_begin_in_turn' AND p.pronargs = 23)
ORDER BY p.proname`)
	require.NoError(t, err)
	type fn struct {
		Name, Lang, Volatility string
		SecurityDefiner        bool
		SearchPath             bool
		GenericPlans           bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fn])
	require.NoError(t, err)
	var want []fn
	for _, name := range []string{"gate_begin", "gate_begin_in_turn", "gate_begin_locked", "gate_evaluate", "gate_heartbeat", "gate_report", "gate_surge"} {
		v := "v"
		if name == "gate_evaluate" || name == "gate_surge" {
			v = "s" // reads with its caller's snapshot
		}
		want = append(want, fn{Name: name, Lang: "plpgsql", Volatility: v, SearchPath: true, GenericPlans: true})
	}
	require.Equal(t, want, got)
}

// A Go fragment that a function also holds a copy of must not change without
// a migration that replaces the function.
func TestGateFunctionsMatchFragments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, fragments := range gate.FunctionFragments {
		var src string
		require.NoError(t, b.env.App.Pool.QueryRow(context.Background(),
			`SELECT string_agg(prosrc, ' ') FROM pg_proc WHERE proname = $1`, name).Scan(&src))
		for _, f := range fragments {
			require.True(t, strings.Contains(src, f),
				"%s no longer holds this fragment; replace the function in a new migration:\n%s", name, f)
		}
	}
}

// Begin, heartbeat and report work through the functions in the pool's exec
// mode, past the point (five executions on a connection) where PL/pgSQL
// switches a statement to its cached generic plan, and a ceiling's refusal
// still comes back through gate_begin as the denial it was.
func TestBeginThroughFunctionsInExecMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "exec", b.env.App.Config.DBQueryExecMode)
	require.Equal(t, pgx.QueryExecModeExec, b.env.App.Pool.Config().ConnConfig.DefaultQueryExecMode)

	for i := 0; i < 40; i++ {
		k := key("fn")
		d := b.mustBegin("execute", email(k))
		id, token := str(d["effect_id"]), str(d["lease_token"])
		b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token})
		require.Equal(t, http.StatusOK, b.report(id, token, "succeeded", map[string]any{"n": i}).Status)
		dup := b.mustBegin("duplicate", email(k))
		require.Equal(t, id, dup["effect_id"])
		require.Equal(t, map[string]any{"n": float64(i)}, dup["result"])
	}

	b.putPolicy("api.call", map[string]any{"daily_budget_micros": 1000})
	b.mustBegin("execute", charge(key("fits"), 1000))
	b.denialOf("budget_exceeded", charge(key("over"), 1))
}

// The previous release's eight-parameter gate_report still answers while a
// deploy replaces its instances (migration 0026 added a ninth).
func TestGateReportKeepsItsPreviousForm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.mustBegin("execute", email(key("old")))
	sum := sha256.Sum256([]byte(str(d["lease_token"])))
	var state string
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT state FROM gate_report($1::text, $2::text,
		$3::bytea, 'succeeded', NULL::bytea, NULL::jsonb, $4::timestamptz, NULL::text)`,
		d["effect_id"], b.ws.ID, sum[:], b.clock.Now()).Scan(&state))
	require.Equal(t, "succeeded", state)
}

// The previous release's 23-parameter gate_begin_in_turn still begins while
// a deploy replaces its instances (migration 0028 added a 24th).
func TestGateBeginInTurnKeepsItsPreviousForm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 5})
	var inserted bool
	var state string
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT inserted, state FROM gate_begin_in_turn($1::text,
		'sms.send', 'old-release', NULL::bigint, '{}'::text[], NULL::int, 'fp', $2::timestamptz, $3::text, '{}'::jsonb,
		NULL::bytea, NULL::jsonb, '\x00'::bytea, 'key_previous_release', $4::text, NULL::text, NULL::text, NULL::bytea, NULL::text,
		$5::text, NULL::bigint, NULL::text, $6::text)`, b.ws.ID, b.clock.Now(), ids.New(ids.Effect), ids.New(ids.Approval),
		ids.New(ids.Event), ids.New(ids.Event)).Scan(&inserted, &state))
	require.True(t, inserted)
	require.Equal(t, "leased", state)
}
