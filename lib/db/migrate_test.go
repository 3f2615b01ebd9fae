package db_test

import (
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/migrations"
)

// freshDatabase creates an empty database next to the package's one.
func freshDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin := apitest.DatabaseURL(t)
	name := testpg.TestDatabaseName(time.Now())
	u, err := testpg.CreateDatabase(ctx, admin, name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = testpg.DropDatabase(context.Background(), admin, name) })
	return u
}

func TestConcurrentMigrationsApplyEachFileOnce(t *testing.T) {
	t.Parallel()
	target := freshDatabase(t)
	all, err := db.LoadMigrations(migrations.FS)
	require.NoError(t, err)
	require.NotEmpty(t, all)

	const instances = 8
	var wg sync.WaitGroup
	applied := make([][]int, instances)
	errs := make([]error, instances)
	for i := 0; i < instances; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			applied[i], errs[i] = db.MigrateURL(context.Background(), target, migrations.FS)
		}(i)
	}
	wg.Wait()
	total := 0
	for i := range errs {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	require.Equal(t, len(all), total, "each migration applied by exactly one instance")

	conn, err := pgx.Connect(context.Background(), target)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM schema_migrations`).Scan(&n))
	require.Equal(t, len(all), n)

	again, err := db.MigrateURL(context.Background(), target, migrations.FS)
	require.NoError(t, err)
	require.Empty(t, again)

	// The pool's settings in the URL are the pool's, not the server's
	// (serverless QA: pool_max_conns failed the migration's connection).
	sep := "?"
	if strings.Contains(target, "?") {
		sep = "&"
	}
	again, err = db.MigrateURL(context.Background(), target+sep+"pool_max_conns=2", migrations.FS)
	require.NoError(t, err)
	require.Empty(t, again)
}

// An instance of the previous release started on a database its successor
// migrated (a rolling deploy, a rollback) applies nothing and serves:
// Migrate neither refuses the versions it does not know nor applies again
// the ones it does (README, Upgrading). Rolling-deploy QA started the
// releases before 0069 and 0070 on 0070's schema.
func TestAnEarlierReleaseMigratesNothingOnALaterSchema(t *testing.T) {
	t.Parallel()
	target := freshDatabase(t)
	ctx := context.Background()
	_, err := db.MigrateURL(ctx, target, migrations.FS)
	require.NoError(t, err)
	all, err := db.LoadMigrations(migrations.FS)
	require.NoError(t, err)
	earlier := fstest.MapFS{}
	for _, m := range all[:len(all)-1] {
		earlier[fmt.Sprintf("%04d_%s.sql", m.Version, m.Name)] = &fstest.MapFile{Data: []byte(m.SQL)}
	}
	applied, err := db.MigrateURL(ctx, target, earlier)
	require.NoError(t, err)
	require.Empty(t, applied)
	conn, err := pgx.Connect(ctx, target)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var latest int
	require.NoError(t, conn.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&latest))
	require.Equal(t, all[len(all)-1].Version, latest)
}

func TestFailedMigrationLeavesNothingHalfApplied(t *testing.T) {
	t.Parallel()
	target := freshDatabase(t)
	fsys := fstest.MapFS{
		"0001_ok.sql":     {Data: []byte(`CREATE TABLE a (id int);`)},
		"0002_broken.sql": {Data: []byte(`CREATE TABLE b (id int); SELECT no_such_function();`)},
	}
	_, err := db.MigrateURL(context.Background(), target, fsys)
	require.ErrorContains(t, err, "0002_broken")
	conn, err := pgx.Connect(context.Background(), target)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var tables int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('a', 'b', 'schema_migrations')`).Scan(&tables))
	require.Zero(t, tables)
}

func TestLoadMigrationsRejectsDuplicateVersions(t *testing.T) {
	t.Parallel()
	_, err := db.LoadMigrations(fstest.MapFS{
		"0001_a.sql": {Data: []byte(`SELECT 1`)},
		"0001_b.sql": {Data: []byte(`SELECT 1`)},
	})
	require.ErrorContains(t, err, "0001")
}

func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(apitest.DatabaseURL(t))
	require.NoError(t, err)
	u.Host = "127.0.0.1:1" // nothing listens on port 1
	_, err = pgx.Connect(context.Background(), u.String())
	require.Error(t, err)
	require.True(t, db.IsUnavailable(err))

	conn, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `SELECT * FROM no_such_table`)
	require.Error(t, err)
	require.False(t, db.IsUnavailable(err), "a rejected query is not an outage")
}

// A connection that ends while a statement is in flight is an outage, and
// one whose statement was sent may have been applied; a failed connect was
// not.
func TestConnectionLostMidStatement(t *testing.T) {
	t.Parallel()
	conn, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	victim, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer victim.Close(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := victim.Exec(context.Background(), `SELECT pg_sleep(10)`)
		done <- err
	}()
	pid := victim.PgConn().PID()
	require.Eventually(t, func() bool {
		var killed bool
		_ = conn.QueryRow(context.Background(), `SELECT pg_terminate_backend($1::int)`, pid).Scan(&killed)
		return killed
	}, 5*time.Second, 20*time.Millisecond)
	err = <-done
	require.Error(t, err)
	require.True(t, db.IsUnavailable(err), "%v", err)
	require.False(t, db.Unapplied(err), "the statement was sent: %v", err)

	u, _ := url.Parse(apitest.DatabaseURL(t))
	u.Host = "127.0.0.1:1"
	_, err = pgx.Connect(context.Background(), u.String())
	require.True(t, db.Unapplied(err), "nothing was sent: %v", err)

	// The connection ends under the statement with no word from the server
	// (a crash, a reset): the read ends in EOF.
	cut, err := testpg.StartCutProxy(apitest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(cut.Close)
	cfg, err := pgx.ParseConfig(cut.URL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec // the service's mode
	through, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	go func() { time.Sleep(200 * time.Millisecond); cut.Cut() }()
	_, err = through.Exec(context.Background(), `SELECT pg_sleep(10)`)
	require.Error(t, err)

	require.True(t, db.IsUnavailable(err), "%v", err)
	require.False(t, db.Unapplied(err), "the statement was sent: %v", err)
}

// upTo is the embedded migrations numbered up to last.
func upTo(t *testing.T, last int) fstest.MapFS {
	t.Helper()
	all, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	out := fstest.MapFS{}
	for _, name := range all {
		n, err := strconv.Atoi(name[:4])
		require.NoError(t, err)
		if n <= last {
			data, err := fs.ReadFile(migrations.FS, name)
			require.NoError(t, err)
			out[name] = &fstest.MapFile{Data: data}
		}
	}
	return out
}

// databaseAt is a fresh database migrated up to version through, and a
// connection to it for a test to write what an upgrade finds.
func databaseAt(t *testing.T, through int) (string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	target := freshDatabase(t)
	_, err := db.MigrateURL(ctx, target, upTo(t, through))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, target)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return target, conn
}

// upgradedFrom is a database migrated through migration through, given the
// rows seed inserts, then migrated to the latest: an upgrade's test reads
// what the later migrations made of the rows.
func upgradedFrom(t *testing.T, through int, seed string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	target, conn := databaseAt(t, through)
	_, err := conn.Exec(ctx, seed)
	require.NoError(t, err)
	_, err = db.MigrateURL(ctx, target, migrations.FS)
	require.NoError(t, err)
	return conn
}

// 0019 fails the runs that already had an exhausted or cancelled step when
// it is applied, as it fails runs from then on.
func TestRunsWithAFailedStepFailOnUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := upgradedFrom(t, 18, `
INSERT INTO workspaces (id, name) VALUES ('ws_1', 'w');
INSERT INTO job_endpoints (id, workspace_id, name, preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms,
    jitter_percent, default_timeout_ms, created_at, updated_at)
VALUES ('end_1', 'ws_1', 'mail', 'STANDARD', 5, 30000, 2, 900000, 20, 30000, now(), now());
INSERT INTO job_runs (id, workspace_id, name, status, created_at)
VALUES ('run_failed', 'ws_1', 'r', 'RUNNING', now()), ('run_fine', 'ws_1', 'r', 'RUNNING', now());
INSERT INTO jobs (id, step_id, workspace_id, run_id, name, version, endpoint_id, idempotency_key, request_hash, status,
    policy_version, policy_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms, jitter_percent, timeout_ms,
    created_at, updated_at)
SELECT 'job_' || r || s, 'stp_' || r || s, 'ws_1', r, 'mail', '1', 'end_1', r || s, '\x00', st,
    1, 'STANDARD', 5, 30000, 2, 900000, 20, 30000, now(), now()
FROM (VALUES ('run_failed', 'a', 'EXHAUSTED'), ('run_failed', 'b', 'QUEUED'), ('run_fine', 'a', 'SUCCEEDED'),
             ('run_fine', 'b', 'QUEUED')) v(r, s, st);`)
	status := map[string]string{}
	rows, err := conn.Query(ctx, `SELECT id, status FROM job_runs`)
	require.NoError(t, err)
	for rows.Next() {
		var id, st string
		require.NoError(t, rows.Scan(&id, &st))
		status[id] = st
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{"run_failed": "FAILED", "run_fine": "RUNNING"}, status)
}

// 0035 bounds the learned surge baseline of the types whose retention may
// already have deleted effects inside its 7-day window (a retention_days
// under 8, and a history older than it), and drops their cached baselines;
// others keep theirs.
func TestShortRetentionBoundsSurgeHistoryOnUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := upgradedFrom(t, 34, `
INSERT INTO workspaces (id, name) VALUES ('ws_1', 'w');
`+policiesWithRetention(`('short', 2), ('short.new', 2), ('week', 8)`)+`;
INSERT INTO gate_effect_types (workspace_id, effect_type, first_seen_at, baseline_for, baseline_median)
SELECT 'ws_1', t, now() - make_interval(days => age), date_trunc('hour', now(), 'UTC'), 7
FROM (VALUES ('short', 5), ('short.new', 1), ('week', 30), ('no.policy', 30)) v(t, age);`)
	type history struct {
		bounded, cached bool
	}
	got := map[string]history{}
	rows, err := conn.Query(ctx, `SELECT t.effect_type,
		h.history_from BETWEEN now() - interval '2 days 1 minute' AND now() - interval '2 days', t.baseline_for IS NOT NULL
		FROM gate_effect_types t
		LEFT JOIN gate_effect_history h ON h.workspace_id = t.workspace_id AND h.effect_type = t.effect_type`)
	require.NoError(t, err)
	for rows.Next() {
		var typ string
		var bounded *bool
		var h history
		require.NoError(t, rows.Scan(&typ, &bounded, &h.cached))
		h.bounded = bounded != nil && *bounded
		got[typ] = h
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]history{
		"short":     {bounded: true, cached: false},
		"short.new": {bounded: false, cached: true}, // younger than its retention: nothing deleted yet
		"week":      {bounded: false, cached: true},
		"no.policy": {bounded: false, cached: true}, // 90 days
	}, got)
}

// 0037 gives every committed group its keep_until: the commit plus the
// longest retention_days among its steps' types (90 without a policy, and
// for a group without steps); other groups get none.
func TestCommittedGroupsGetTheirKeepUntilOnUpgrade(t *testing.T) {
	t.Parallel()
	conn := upgradedFrom(t, 36, `
INSERT INTO workspaces (id, name) VALUES ('ws_1', 'w');
`+policiesWithRetention(`('charge', 3), ('refund', 200)`)+`;
INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id, created_at, updated_at, committed_at)
VALUES ('grp_short', 'ws_1', 'g', 'committed', 'key_1', '2026-01-01', '2026-01-01', '2026-01-01'),
       ('grp_mixed', 'ws_1', 'g', 'committed', 'key_1', '2026-01-01', '2026-01-01', '2026-01-01'),
       ('grp_empty', 'ws_1', 'g', 'committed', 'key_1', '2026-01-01', '2026-01-01', '2026-01-01'),
       ('grp_open', 'ws_1', 'g', 'open', 'key_1', '2026-01-01', '2026-01-01', NULL);
INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, lease_seconds, group_id,
    created_by_key_id, created_at, updated_at)
VALUES ('eff_1', 'ws_1', 'charge', 'k1', 'f', 'succeeded', 60, 'grp_short', 'key_1', '2026-01-01', '2026-01-01'),
       ('eff_2', 'ws_1', 'charge', 'k2', 'f', 'succeeded', 60, 'grp_mixed', 'key_1', '2026-01-01', '2026-01-01'),
       ('eff_3', 'ws_1', 'email', 'k3', 'f', 'succeeded', 60, 'grp_mixed', 'key_1', '2026-01-01', '2026-01-01'),
       ('eff_4', 'ws_1', 'charge', 'k4', 'f', 'succeeded', 60, 'grp_open', 'key_1', '2026-01-01', '2026-01-01');`)
	got := byID[*string](t, conn, `SELECT id, (keep_until::date - committed_at::date) || ' days' FROM effect_groups`)
	days := func(s string) *string { return &s }
	require.Equal(t, map[string]*string{"grp_short": days("3 days"), "grp_mixed": days("90 days"),
		"grp_empty": days("90 days"), "grp_open": nil}, got)
}

// 0038 dates every group whose rollback ended: its end plus the longest
// retention_days among its effects' types (90 without a policy, and for a
// group without effects left); committed groups keep 0037's date, and the
// index of groups kept now holds all three states.
func TestEndedGroupsGetTheirKeepUntilOnUpgrade(t *testing.T) {
	t.Parallel()
	conn := upgradedFrom(t, 37, `
INSERT INTO workspaces (id, name) VALUES ('ws_1', 'w');
`+policiesWithRetention(`('charge', 3), ('refund', 200)`)+`;
INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id, created_at, updated_at, committed_at,
    finished_at, keep_until)
VALUES ('grp_unwound', 'ws_1', 'g', 'unwound', 'key_1', '2026-01-01', '2026-01-05', NULL, '2026-01-05', NULL),
       ('grp_failed', 'ws_1', 'g', 'unwind_failed', 'key_1', '2026-01-01', '2026-01-05', NULL, '2026-01-05', NULL),
       ('grp_emptied', 'ws_1', 'g', 'unwound', 'key_1', '2026-01-01', '2026-01-05', NULL, '2026-01-05', NULL),
       -- committed, then unwound by the previous release: dated from its commit
       ('grp_recommitted', 'ws_1', 'g', 'unwound', 'key_1', '2026-01-01', '2026-01-09', '2026-01-02', '2026-01-09',
        '2026-01-05'),
       ('grp_committed', 'ws_1', 'g', 'committed', 'key_1', '2026-01-01', '2026-01-01', '2026-01-01', NULL,
        '2026-01-04'),
       ('grp_unwinding', 'ws_1', 'g', 'unwinding', 'key_1', '2026-01-01', '2026-01-05', NULL, NULL, NULL);
INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, lease_seconds, group_id,
    created_by_key_id, created_at, updated_at)
VALUES ('eff_1', 'ws_1', 'charge', 'k1', 'f', 'succeeded', 60, 'grp_unwound', 'key_1', '2026-01-01', '2026-01-01'),
       ('eff_2', 'ws_1', 'refund', 'k2', 'f', 'succeeded', 60, 'grp_unwound', 'key_1', '2026-01-05', '2026-01-05'),
       ('eff_3', 'ws_1', 'charge', 'k3', 'f', 'succeeded', 60, 'grp_failed', 'key_1', '2026-01-01', '2026-01-01'),
       ('eff_4', 'ws_1', 'charge', 'k4', 'f', 'succeeded', 60, 'grp_unwinding', 'key_1', '2026-01-01', '2026-01-01'),
       ('eff_5', 'ws_1', 'charge', 'k5', 'f', 'succeeded', 60, 'grp_recommitted', 'key_1', '2026-01-01', '2026-01-01');`)
	got := byID[*string](t, conn, `SELECT id, keep_until::date::text FROM effect_groups`)
	day := func(s string) *string { return &s }
	require.Equal(t, map[string]*string{"grp_unwound": day("2026-07-24"), "grp_failed": day("2026-01-08"),
		"grp_emptied": day("2026-04-05"), "grp_committed": day("2026-01-04"), "grp_recommitted": day("2026-01-12"),
		"grp_unwinding": nil}, got)

	predicates := byID[string](t, conn, `SELECT c.relname::text, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname IN ('effect_groups_kept_idx', 'effects_ended_ungrouped_idx', 'effect_groups_due_idx')`)
	require.Equal(t, map[string]string{
		"effect_groups_kept_idx":      "(state = ANY (ARRAY['committed'::text, 'unwound'::text, 'unwind_failed'::text]))",
		"effects_ended_ungrouped_idx": "((group_id IS NULL) AND (state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'denied'::text])))",
		"effect_groups_due_idx":       "(state = 'committed'::text)", // the previous release's, kept for its deploy
	}, predicates)
}

// byID runs sql, whose rows are (id, value), and maps each id to its value.
// 0061 makes the steps replayed while their cancelled attempt may still
// run due at that attempt's lease expiry, as replays are from then on, so
// claims stop reading them: only QUEUED jobs holding an attempt whose lease
// has not expired move; a lapsed one, a cancelled one and a plain queued
// one keep their times.
func TestWaitingReplaysAreDueAtTheirAttemptsLeaseOnUpgrade(t *testing.T) {
	t.Parallel()
	conn := upgradedFrom(t, 60, `
INSERT INTO workspaces (id, name) VALUES ('ws_1', 'w');
INSERT INTO job_endpoints (id, workspace_id, name, preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms,
    jitter_percent, default_timeout_ms, created_at, updated_at)
VALUES ('end_1', 'ws_1', 'mail', 'STANDARD', 5, 30000, 2, 900000, 20, 30000, now(), now());
INSERT INTO job_runs (id, workspace_id, name, status, created_at) VALUES ('run_1', 'ws_1', 'r', 'RUNNING', now());
INSERT INTO jobs (id, step_id, workspace_id, run_id, name, version, endpoint_id, idempotency_key, request_hash, status,
    policy_version, policy_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms, jitter_percent, timeout_ms,
    created_at, updated_at, attempt, slot_attempt, lease_expires_at, due_at, ready_at)
SELECT 'job_' || k, 'stp_' || k, 'ws_1', 'run_1', 'mail', '1', 'end_1', k, '\x00', st,
    1, 'STANDARD', 5, 30000, 2, 900000, 20, 30000, now(), now(), 1, held, lease,
    CASE WHEN st = 'QUEUED' THEN '2026-01-01'::timestamptz END, CASE WHEN st = 'QUEUED' THEN '2026-01-01'::timestamptz END
FROM (VALUES ('waiting', 'QUEUED', 1, now() + interval '1 hour'),
             ('lapsed', 'QUEUED', 1, now() - interval '1 minute'),
             ('cancelled', 'CANCELLED', 1, now() + interval '1 hour'),
             ('plain', 'QUEUED', NULL, now() + interval '1 hour')) v(k, st, held, lease);`)
	got := byID[string](t, conn, `SELECT id, CASE
		WHEN ready_at IS NULL AND due_at IS NULL THEN 'none'
		WHEN ready_at = lease_expires_at AND due_at = lease_expires_at THEN 'lease'
		WHEN ready_at = '2026-01-01' AND due_at = '2026-01-01' THEN 'kept'
		ELSE 'other' END FROM jobs`)
	require.Equal(t, map[string]string{"job_waiting": "lease", "job_lapsed": "kept", "job_cancelled": "none",
		"job_plain": "kept"}, got)
}

// 0065 erases the signing secrets, current and previous, of the webhooks
// already deleted, keeps the live ones', and from then on refuses a live
// webhook without a secret.
func TestDeletedWebhooksLoseTheirSecretsOnUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := upgradedFrom(t, 64, `
INSERT INTO workspaces (id, name) VALUES ('ws_1', 'w');
INSERT INTO webhooks (id, workspace_id, url, events, secret, previous_secret, previous_secret_expires_at,
    created_at, deleted_at)
VALUES ('whk_live', 'ws_1', 'https://example.com/a', '{run.finished}', '\x01aa', '\x01bb', now() + interval '1 hour',
        now(), NULL),
       ('whk_gone', 'ws_1', 'https://example.com/b', '{run.finished}', '\x01cc', '\x01dd', now() + interval '1 hour',
        now(), now()),
       ('whk_gone_plain', 'ws_1', 'https://example.com/c', '{run.finished}', '\x01ee', NULL, NULL, now(), now());`)
	got := byID[string](t, conn, `SELECT id, coalesce(encode(secret, 'hex'), '-') || '/' ||
		coalesce(encode(previous_secret, 'hex'), '-') || '/' || (previous_secret_expires_at IS NOT NULL)::text
		FROM webhooks`)
	require.Equal(t, map[string]string{"whk_live": "01aa/01bb/true", "whk_gone": "-/-/false",
		"whk_gone_plain": "-/-/false"}, got)
	_, err := conn.Exec(ctx, `UPDATE webhooks SET secret = NULL WHERE id = 'whk_live'`)
	require.ErrorContains(t, err, "webhooks_live_secret")
}

// 0067 links an answer kept for an Idempotency-Key to the resource whose
// secret it shows: the answers kept before it name none (NULL, for the
// sweeper to link through idempotent_requests_unlinked_idx) and keep their
// answer; the index that a delete's erasure reads holds the linked answers
// that still show a secret only.
func TestAnswersKeptBeforeTheUpgradeNameNoResource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := upgradedFrom(t, 66, `
INSERT INTO idempotent_requests (key_id, idempotency_key, request_hash, request_id, status, answer, created_at)
VALUES ('key_1', 'create-1', '\x00', 'req_1', 201, '\x01aa', now());`)
	var resource *string
	var answer string
	require.NoError(t, conn.QueryRow(ctx, `SELECT resource_id, encode(answer, 'hex') FROM idempotent_requests`).
		Scan(&resource, &answer))
	require.Nil(t, resource)
	require.Equal(t, "01aa", answer)
	defs := byID[string](t, conn, `SELECT indexname, indexdef FROM pg_indexes
		WHERE indexname IN ('idempotent_requests_resource_idx', 'idempotent_requests_unlinked_idx')`)
	require.Len(t, defs, 2)
	require.Contains(t, defs["idempotent_requests_resource_idx"],
		"(resource_id) WHERE ((resource_id <> ''::text) AND (answer IS NOT NULL))")
	require.Contains(t, defs["idempotent_requests_unlinked_idx"],
		"(created_at) WHERE ((resource_id IS NULL) AND (answer IS NOT NULL))")
}

// 0068 makes the answers the release of 0067 recorded as showing no secret
// (a key's create's among them, which shows the new key's) name nothing
// again, as those kept before 0067, for the sweeper to open and link; an
// answer linked to a resource, an erased one and a claim are left as they
// were.
func TestAnswersRecordedAsShowingNoSecretAreReadAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := upgradedFrom(t, 67, `
INSERT INTO idempotent_requests (key_id, idempotency_key, request_hash, request_id, status, answer, created_at,
    resource_id, claimed_until)
VALUES ('key_1', 'key-create', '\x00', 'req_1', 201, '\x01aa', now(), '', NULL),
       ('key_1', 'hook-create', '\x00', 'req_2', 201, '\x01bb', now(), 'whk_1', NULL),
       ('key_1', 'hook-erased', '\x00', 'req_3', 404, NULL, now(), 'whk_2', NULL),
       ('key_1', 'claimed', '\x00', 'req_4', NULL, NULL, now(), NULL, now());`)
	resources := byID[*string](t, conn, `SELECT idempotency_key, resource_id FROM idempotent_requests`)
	whk1, whk2 := "whk_1", "whk_2"
	require.Equal(t, map[string]*string{"key-create": nil, "hook-create": &whk1, "hook-erased": &whk2, "claimed": nil},
		resources)
	var answer string
	require.NoError(t, conn.QueryRow(ctx, `SELECT encode(answer, 'hex') FROM idempotent_requests
		WHERE idempotency_key = 'key-create'`).Scan(&answer))
	require.Equal(t, "01aa", answer)
}

func byID[T any](t *testing.T, conn *pgx.Conn, sql string) map[string]T {
	t.Helper()
	rows, err := conn.Query(context.Background(), sql)
	require.NoError(t, err)
	out := map[string]T{}
	for rows.Next() {
		var id string
		var v T
		require.NoError(t, rows.Scan(&id, &v))
		out[id] = v
	}
	require.NoError(t, rows.Err())
	return out
}

// policiesWithRetention is SQL giving workspace ws_1 a policy for each
// ('type', retention_days) pair of values.
func policiesWithRetention(values string) string {
	return `INSERT INTO gate_policies (workspace_id, effect_type, version, mode, on_indeterminate, lease_seconds,
    max_attempts, require_cost, required_dimensions, dimension_limits, surge_action, surge_cooldown_seconds,
    retention_days, created_at, updated_at)
SELECT 'ws_1', t, 1, 'allow', 'block', 60, 3, false, '{}', '{}', 'require_approval', 3600, d, now(), now()
FROM (VALUES ` + values + `) v(t, d)`
}

// withOptions is url with the session settings given as the connection's
// options (a space in a value escaped with a backslash, as the server
// reads them), which rank as a database's or role's settings would beneath the
// startup parameters Ratchet sends.
func withOptions(url string, settings ...string) string {
	var opts []string
	for _, s := range settings {
		opts = append(opts, "-c%20"+strings.NewReplacer("=", "%3D", ",", "%2C", " ", "%20", `\`, "%5C").Replace(s))
	}
	return url + "&options=" + strings.Join(opts, "%20")
}

// Settings Ratchet cannot work with, and that PgBouncer would not let it
// send at connection start, stop the migration before it creates anything,
// naming the setting (QA: each made every keyed request, or every job
// report, answer 500 once running).
func TestMigrateRefusesSettingsRatchetCannotWorkWith(t *testing.T) {
	t.Parallel()
	for setting, named := range map[string]string{
		"bytea_output=escape":                            `bytea_output is "escape"`,
		"array_nulls=off":                                `array_nulls is "off"`,
		"default_transaction_isolation=serializable":     `default_transaction_isolation is "serializable"`,
		`default_transaction_isolation=repeatable\ read`: `default_transaction_isolation is "repeatable read"`,
	} {
		target := freshDatabase(t)
		_, err := db.MigrateURL(context.Background(), withOptions(target, setting), migrations.FS)
		require.ErrorContains(t, err, named)
		conn, err := pgx.Connect(context.Background(), target)
		require.NoError(t, err)
		var tables int
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables))
		require.Zero(t, tables, "%s: nothing created", setting)
		conn.Close(context.Background())
	}
}

// A search_path changed after migrating does not fork the schema: the
// migration refuses to build an empty copy in the schema it now finds first,
// which the service would have served from, every workspace gone (QA).
func TestMigrateRefusesASearchPathThatLostItsSchema(t *testing.T) {
	t.Parallel()
	target := freshDatabase(t)
	fsys := fstest.MapFS{"0001_a.sql": {Data: []byte(`CREATE TABLE a (id int);`)}}
	_, err := db.MigrateURL(context.Background(), target, fsys)
	require.NoError(t, err)
	conn, err := pgx.Connect(context.Background(), target)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `CREATE SCHEMA other`)
	require.NoError(t, err)

	_, err = db.MigrateURL(context.Background(), withOptions(target, "search_path=other"), fsys)
	require.ErrorContains(t, err, `migrated in schema "public"`)
	var copies int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'other'`).Scan(&copies))
	require.Zero(t, copies)
	// Where it finds the schema first, it migrates as ever.
	_, err = db.MigrateURL(context.Background(), withOptions(target, "search_path=other,public"), fsys)
	require.NoError(t, err)
	// A second copy on purpose: its schema_migrations created first, as the
	// refusal says.
	_, err = conn.Exec(context.Background(), `SET search_path = other`)
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, `+
		`name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	_, err = db.MigrateURL(context.Background(), withOptions(target, "search_path=other"), fsys)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'other'`).Scan(&copies))
	require.Equal(t, 2, copies, "schema_migrations and a")
}

// The previous release serves while 0058 applies, and two of its
// statements lock job_executions before job_workers: its heartbeat
// (30b2204's sqlHeartbeat, verbatim) and its claim sent with a claimId (as
// every SDK sends one), whose first statement reads the claim's held jobs.
// 0058 locks both tables (a column on one, an index on the other): it takes
// them in the same order, so one of those that comes while it waits for
// job_workers (here, for a writer still open) waits for the migration
// holding nothing it needs. The other way round they deadlocked, and
// Postgres failed the heartbeat, the claim or the migration (deploy QA).
func TestUpgradeTo0058DeadlocksNoneOfThePreviousReleasesStatements(t *testing.T) {
	t.Parallel()
	for name, previous := range map[string]string{
		"heartbeat": `
WITH j AS (
    UPDATE jobs SET lease_expires_at = greatest(lease_expires_at,
            $4::timestamptz + (timeout_ms + $5::bigint) * interval '1 millisecond'),
        ready_at = greatest(lease_expires_at, $4::timestamptz + (timeout_ms + $5::bigint) * interval '1 millisecond'),
        updated_at = $4::timestamptz
    WHERE id = $1::text AND workspace_id = $2::text AND jobs_lease_token_matches(lease_token, $3::text) AND status = 'RUNNING'
      AND ($6::text[] IS NULL OR name || '@' || version = ANY($6::text[]))
    RETURNING id, attempt, lease_expires_at, cancel_requested, worker_id
), x AS (
    UPDATE job_executions x SET lease_expires_at = j.lease_expires_at FROM j WHERE x.job_id = j.id AND x.attempt = j.attempt
), w AS (
    UPDATE job_workers w SET last_seen_at = $4::timestamptz FROM j
    WHERE w.id = j.worker_id AND w.last_seen_at < $4::timestamptz - interval '1 minute'
)
SELECT lease_expires_at, cancel_requested FROM j`,
		"claim with a claimId": `SELECT * FROM jobs_claim_keyed($1::text, $2::text, $4::timestamptz, $3::text, 10,
    $5::bigint, $4::timestamptz, 'lapsed', 1000000, 'clm_1', 'secret')
    WHERE $6::text[] IS NULL`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			target, conn := databaseAt(t, 57)
			waiting := func(n int) {
				t.Helper()
				require.Eventually(t, func() bool {
					var got int
					err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
						WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got)
					return err == nil && got == n
				}, 30*time.Second, 5*time.Millisecond)
			}
			// A writer of job_workers still open (a registration, a claim
			// marking its worker seen): 0058 waits for it for its index.
			wconn, err := pgx.Connect(ctx, target)
			require.NoError(t, err)
			defer wconn.Close(ctx)
			writer, err := wconn.Begin(ctx)
			require.NoError(t, err)
			defer writer.Rollback(ctx) //nolint:errcheck // committed below
			_, err = writer.Exec(ctx, `LOCK TABLE job_workers IN ROW EXCLUSIVE MODE`)
			require.NoError(t, err)
			migrated := make(chan error, 1)
			go func() {
				_, err := db.MigrateURL(ctx, target, upTo(t, 58))
				migrated <- err
			}()
			waiting(1)

			old, err := pgx.Connect(ctx, target)
			require.NoError(t, err)
			defer old.Close(ctx)
			served := make(chan error, 1)
			go func() {
				_, err := old.Exec(ctx, previous, "job_1", "ws_1", "wrk_1", time.Now(), 0, nil)
				served <- err
			}()
			waiting(2)

			require.NoError(t, writer.Commit(ctx))
			require.NoError(t, <-migrated)
			require.NoError(t, <-served)
		})
	}
}
