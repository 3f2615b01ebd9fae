package reseal_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/reseal"
	"github.com/getratchet/ratchet/lib/seal"
)

// idOf is the hex id of the key key(b).
func idOf(b byte) string {
	id := seal.KeyID(bytes.Repeat([]byte{b}, 32))
	return hex.EncodeToString(id[:])
}

// recordedKeys reads seal_keys.
func recordedKeys(t *testing.T, env *apitest.Env) []string {
	t.Helper()
	rows, err := env.App.Pool.Query(context.Background(), `SELECT key_id FROM seal_keys ORDER BY key_id`)
	require.NoError(t, err)
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// sorted answers ids in order.
func sorted(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }

// A key removed from the settings while values it sealed remain (before a
// reseal reported complete) is reported by the sweeper: its seal.keys task
// fails at every pass, naming the key id, in the log and in the cron
// route's errors, while the instance serves everything else (seal QA: it
// started and said nothing until a read of such a value failed). A complete
// reseal forgets the old key, and the task passes again without it.
func TestTheSweeperReportsAKeyRemovedTooEarly(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	writeEffect(t, env, ws, "before:1") // sealed with oldKey
	require.Empty(t, env.App.Sweeper.RunOnce(ctx).Errors)
	require.Equal(t, []string{idOf(7)}, recordedKeys(t, env), "the sweeper records its current key")

	rotated := instance(t, newKey, oldKey) // step 2 of the rotation
	writeEffect(t, rotated, ws, "after:1")
	require.Empty(t, rotated.App.Sweeper.RunOnce(ctx).Errors)
	require.Equal(t, sorted(idOf(7), idOf(9)), recordedKeys(t, env))

	// The old key removed before step 3.
	var logs apitest.LockedBuffer
	removed := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		apitest.WithConfig(func(c *config.Config) { c.ResultEncryptionKey, c.ResultEncryptionKeys = newKey, nil }))
	res := removed.App.Sweeper.RunOnce(ctx)
	require.Equal(t, map[string]string{"seal.keys": "failed"}, res.Errors)
	require.Contains(t, logs.String(), "sweep task failed")
	require.Contains(t, logs.String(), "task=seal.keys")
	require.Contains(t, logs.String(), "key id(s) "+idOf(7)+", which this instance is not configured with")
	cron := removed.DoWith("POST", "/api/cron/sweep", "", http.Header{"Authorization": {"Bearer test-cron-secret"}}, nil)
	require.Equal(t, http.StatusOK, cron.Status, "%s", cron.Body)
	require.Equal(t, map[string]any{"seal.keys": "failed"}, cron.JSON()["errors"])
	// It serves all the rest.
	writeEffect(t, removed, ws, "removed:1")

	// Step 3 done: every value is under the new key, the old id forgotten.
	run, err := reseal.New(env.App.Pool, sealer(t, newKey, oldKey)).Run(ctx)
	require.NoError(t, err)
	require.True(t, run.Complete)
	require.Equal(t, []string{idOf(9)}, recordedKeys(t, env))
	require.Empty(t, removed.App.Sweeper.RunOnce(ctx).Errors)
}

// A count records the keys it finds values sealed with, those no instance
// is configured with included: a value sealed before the table existed, or
// by a key never current on a sweeper, is then reported too. A count that
// finds every value under the current key forgets the rest, so a key whose
// values retention deleted stops being reported once reseal -check says so.
func TestACountRecordsTheKeysItFinds(t *testing.T) {
	ctx := context.Background()
	env := fresh(t)
	ws := env.Signup()
	id := writeEffect(t, env, ws, "lost:1")
	lost := sealer(t, key(3))
	_, err := env.App.Pool.Exec(ctx, `UPDATE effects SET result = $2 WHERE id = $1`, id,
		lost.Seal([]byte(`{}`), seal.AAD(id, "result")))
	require.NoError(t, err)
	require.Empty(t, env.App.Sweeper.RunOnce(ctx).Errors, "nothing records key 3 yet")

	check, err := reseal.New(env.App.Pool, sealer(t, oldKey)).Check(ctx)
	require.NoError(t, err)
	require.False(t, check.Complete)
	require.Equal(t, sorted(idOf(3), idOf(7)), recordedKeys(t, env))
	res := env.App.Sweeper.RunOnce(ctx)
	require.Equal(t, map[string]string{"seal.keys": "failed"}, res.Errors)

	// The value deleted (as retention would): a count forgets key 3.
	_, err = env.App.Pool.Exec(ctx, `WITH a AS (DELETE FROM effect_attempts WHERE effect_id = $1)
		DELETE FROM effects WHERE id = $1`, id)
	require.NoError(t, err)
	check, err = reseal.New(env.App.Pool, sealer(t, oldKey)).Check(ctx)
	require.NoError(t, err)
	require.True(t, check.Complete)
	require.Equal(t, []string{idOf(7)}, recordedKeys(t, env))
	require.Empty(t, env.App.Sweeper.RunOnce(ctx).Errors)
}
