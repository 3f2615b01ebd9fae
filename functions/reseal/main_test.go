package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/reseal"
	"github.com/getratchet/ratchet/lib/seal"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

func key(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

// The command as an operator runs it after a rotation: -check says the old
// key is still in use (exit 2), a run re-seals (exit 0), and -check agrees.
func TestRotationCommand(t *testing.T) {
	old := key(5)
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.ResultEncryptionKey = old }))
	ws := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})

	t.Setenv("DATABASE_URL", apitest.DatabaseURL(t))
	t.Setenv("KEY_HASH_SECRET", "reseal-test-secret-0123456789")
	t.Setenv("RESULT_ENCRYPTION_KEY", key(6))
	t.Setenv("RESULT_ENCRYPTION_KEYS", old)
	ctx := context.Background()
	do := func(check, asJSON bool) (int, string) {
		rep, err := run(ctx, Event{Check: check})
		var out, errOut bytes.Buffer
		code := answer(&out, &errOut, rep, err, check, asJSON)
		return code, out.String() + errOut.String()
	}

	code, out := do(true, false)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "run reseal before removing older keys")
	code, out = do(false, true)
	require.Equal(t, 0, code, out)
	var rep reseal.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.True(t, rep.Complete)
	code, out = do(true, false)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "older keys can be removed")

	// A bad setting stops it with one line; an interrupted run says so.
	t.Setenv("RESULT_ENCRYPTION_KEYS", "nope")
	code, out = do(false, false)
	require.Equal(t, 1, code)
	require.True(t, strings.HasPrefix(out, "reseal: config: RESULT_ENCRYPTION_KEYS"), out)
	var errOut bytes.Buffer
	require.Equal(t, 1, answer(&bytes.Buffer{}, &errOut, reseal.Report{}, context.Canceled, false, false))
	require.Contains(t, errOut.String(), "interrupted")

	// Its partial report shows what it did, not the zeros of a count it
	// never made (they read "older key 0": nothing left under the old key).
	var partial bytes.Buffer
	require.Equal(t, 1, answer(&partial, &bytes.Buffer{}, reseal.Report{CurrentKeyID: "00000000",
		Columns: []reseal.ColumnReport{{Column: "effects.payload", Resealed: 3}}}, context.Canceled, false, false))
	require.Contains(t, partial.String(), "resealed 3, skipped (busy, changed or deleted) 0, corrupt 0; stopped before counting")
	require.NotContains(t, partial.String(), "older key 0")
	require.Contains(t, partial.String(), "keep the older keys and run it again")
}

// An interrupted count is no verdict, whatever it had counted: one stopped
// between its columns said "not sealed with the current key" of columns it
// never read, and one stopped while recording the key ids it found (its
// count complete, seal_keys not brought up to it) said "older keys can be
// removed", and complete true in JSON, with exit 1 (review).
func TestAnInterruptedCountGivesNoVerdict(t *testing.T) {
	counted := reseal.Report{CurrentKeyID: "00000000", Complete: true, Counted: true,
		Columns: []reseal.ColumnReport{{Column: "effects.payload", Current: 3}}}
	partial := reseal.Report{CurrentKeyID: "00000000",
		Columns: []reseal.ColumnReport{{Column: "effects.payload", Current: 3}}}
	for name, rep := range map[string]reseal.Report{"counted": counted, "partial": partial} {
		var out, errOut bytes.Buffer
		require.Equal(t, 1, answer(&out, &errOut, rep, context.Canceled, true, false), name)
		require.NotContains(t, out.String(), "can be removed", name)
		require.NotContains(t, out.String(), "run reseal before removing", name)
		require.Contains(t, out.String(), "stopped before it was done", name)
		require.Contains(t, errOut.String(), "interrupted", name)

		out.Reset()
		require.Equal(t, 1, answer(&out, &bytes.Buffer{}, rep, context.Canceled, true, true), name)
		var got reseal.Report
		require.NoError(t, json.Unmarshal(out.Bytes(), &got), name)
		require.False(t, got.Complete, name)
		require.False(t, got.Counted, name)
	}
}

// On Lambda a run that its invocation's time cuts short answers what it did
// (complete false: invoke again to continue), keeping lambdaReserve to
// answer in; it ran to the function's timeout, stopped there with "Task
// timed out" and no report (QA).
func TestAnInvocationCutShortAnswersItsReport(t *testing.T) {
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.ResultEncryptionKey = key(7) }))
	ws := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	t.Setenv("DATABASE_URL", apitest.DatabaseURL(t))
	t.Setenv("KEY_HASH_SECRET", "reseal-test-secret-0123456789")
	t.Setenv("RESULT_ENCRYPTION_KEY", key(8))
	// The package database holds what TestRotationCommand sealed too.
	t.Setenv("RESULT_ENCRYPTION_KEYS", key(7)+","+key(6)+","+key(5))

	// Less than the reserve left: the run stops at once.
	ctx, cancel := context.WithTimeout(context.Background(), lambdaReserve/2)
	defer cancel()
	rep, err := invoke(ctx, Event{})
	require.NoError(t, err, "a run cut short by the reserve is an answer, not the invocation's error")
	require.False(t, rep.Complete)
	require.False(t, rep.Counted, "its counts were never made")
	require.NotEmpty(t, rep.CurrentKeyID)

	// With its time, the next invocation completes.
	ctx, cancel = context.WithTimeout(context.Background(), lambdaReserve+time.Minute)
	defer cancel()
	rep, err = invoke(ctx, Event{})
	require.NoError(t, err)
	require.True(t, rep.Complete)
	require.True(t, rep.Counted)
}

// A run stopped before it reached its database reports the configured
// current key id (it answered "currentKeyId": ""), and on Lambda an error
// met after the reserve began (a malformed DATABASE_URL) is the
// invocation's error, not a run cut short to continue (ops QA).
func TestARunStoppedBeforeConnectingNamesTheKey(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?pool_max_conns=many")
	t.Setenv("KEY_HASH_SECRET", "reseal-test-secret-0123456789")
	t.Setenv("RESULT_ENCRYPTION_KEY", key(9))
	t.Setenv("RESULT_ENCRYPTION_KEYS", "")
	id := seal.KeyID(bytes.Repeat([]byte{9}, 32))
	rep, err := run(context.Background(), Event{})
	require.ErrorContains(t, err, "DATABASE_URL is malformed")
	require.Equal(t, hex.EncodeToString(id[:]), rep.CurrentKeyID)
	require.False(t, rep.Complete)
	require.False(t, rep.Counted)

	ctx, cancel := context.WithTimeout(context.Background(), lambdaReserve/2)
	defer cancel()
	_, err = invoke(ctx, Event{})
	require.ErrorContains(t, err, "DATABASE_URL is malformed")
}

// A run names the values that fail to open under their key (table, key,
// column; never the value), in its text and its JSON (the Lambda answer
// is the same report): it printed counts only, so an operator could not
// find them, and the older key stayed in use for ever (review).
func TestARunNamesTheDamagedValues(t *testing.T) {
	rep := reseal.Report{CurrentKeyID: "00000000", Counted: true,
		Columns: []reseal.ColumnReport{{Column: "effects.result", Older: 3, Corrupt: 2},
			{Column: "idempotent_requests.answer", Current: 1}},
		Damaged: []reseal.DamagedValue{{Table: "effects", Column: "result", Key: map[string]string{"id": "eff_1"}}}}
	var out bytes.Buffer
	require.Equal(t, 2, answer(&out, &bytes.Buffer{}, rep, nil, false, false))
	text := out.String()
	require.Contains(t, text, "older key 3, unknown key 0, of which corrupt 2")
	require.Contains(t, text, "2 value(s) fail to open under the key they name")
	require.Contains(t, text, "the first 1:\n  effects.result id=\"eff_1\"\n")

	out.Reset()
	require.Equal(t, 2, answer(&out, &bytes.Buffer{}, rep, nil, false, true))
	var got reseal.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	require.Equal(t, rep.Damaged, got.Damaged)
	require.Contains(t, out.String(), `"damaged": [`)
}

// A run stopped before it started (interrupted while it connected; on
// Lambda, its time up there) answers "damaged": [] and "columns": [] in
// JSON, as README promises, not null (QA: both read null).
func TestAReportOfNothingHasEmptyLists(t *testing.T) {
	var out bytes.Buffer
	require.Equal(t, 1, answer(&out, &bytes.Buffer{}, reseal.Report{}, context.Canceled, false, true))
	var got map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	require.Equal(t, []any{}, got["damaged"])
	require.Equal(t, []any{}, got["columns"])

	// The Lambda answer is the same report, as the runtime marshals it.
	answered, err := json.Marshal(reseal.Report{})
	require.NoError(t, err)
	require.Contains(t, string(answered), `"damaged":[]`)
}
