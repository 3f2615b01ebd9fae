package auth_test

import (
	"context"
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/stretchr/testify/require"
)

// A page of a workspace's keys, of any or of those one key minted
// (?created_by=), reads that page, first or after a cursor, however it is
// planned: with no index led by the workspace and the minting key
// (api_keys_created_by_idx, migration 0072), the keys a key minted among
// the workspace's oldest were found by reading the workspace's keys (a
// thousand for a page of them, 20,000 after a cursor past them all); with
// it, a plan made for any value read the primary key in id order from the
// cursor (50,000, every workspace's keys after it) until the page's
// statement bounded the index's whole key. The minted keys are every
// twentieth of the workspace's first 2,000; the rest were minted by
// another key, or by none (a signup key).
func TestAPageOfKeysReadsThePage(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	testpg.CheckPages(t, env.App.Pool, testpg.Pages{
		Table: "api_keys",
		Seed: `INSERT INTO api_keys (id, workspace_id, name, secret_hash, scopes, created_by_key_id)
			SELECT 'key_' || lpad(g::text, 26, '0'), CASE WHEN g <= $1 THEN 'ws_h0' ELSE 'ws_h1' END, 'k' || g,
				'\x00', '{jobs:work}', CASE WHEN g <= 2000 AND g % 20 = 0 THEN 'key_minter'
					WHEN g % 1000 = 1 THEN NULL ELSE 'key_other' END
			FROM generate_series(1, $1::int * 3) g`,
		Rare:   "key_minter",
		Cursor: "key_" + strings.Repeat("0", 21) + "10000",
		Page: func(cursor, createdBy string, limit int) (string, []any) {
			return auth.ListKeysSQL("ws_h0", createdBy, cursor, limit)
		},
	})
}

// A revoke's locking statement reads its workspace's keys (for its root
// keys: 4,000 rows read here, as the statement before the revoke with
// minted keys read) and its tree, through api_keys_created_by_idx, with
// or without the keys minted, however it is planned: never the other
// workspaces' keys (60,000 here) nor, for the tree, every key of the
// workspace once per level (12,000 when the tree's join was planned as a
// hash join). The workspace holds 2,000 keys, a tree of 2 levels among
// them.
func TestARevokeLocksItsWorkspacesKeysOnly(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, env.App.Pool, "api_keys")
	_, err := tx.Exec(ctx, `
		INSERT INTO api_keys (id, workspace_id, name, secret_hash, scopes, created_by_key_id)
		SELECT 'key_' || lpad(g::text, 26, '0'), CASE WHEN g <= 2000 THEN 'ws_r0' ELSE 'ws_r' || (g % 30) END,
			'k' || g, '\x00', '{effects:begin}',
			CASE WHEN g = 1 THEN NULL WHEN g <= 10 THEN 'key_' || lpad('1', 26, '0')
				WHEN g <= 100 THEN 'key_' || lpad((g / 10)::text, 26, '0') ELSE 'key_' || lpad('1', 26, '0') END
		FROM generate_series(1, 62000) g;
		ANALYZE api_keys`)
	require.NoError(t, err)
	top := "key_" + strings.Repeat("0", 25) + "2"
	caller := "key_" + strings.Repeat("0", 23) + "500" // the calling key, outside the tree
	for _, mode := range testpg.PlanCacheModes {
		for _, withMinted := range []bool{false, true} {
			read, _, err := testpg.RowsRead(ctx, tx, mode, auth.SQLLockRevoke, top, "ws_r0", withMinted, auth.AllScopes,
				caller)
			require.NoError(t, err, "%s, %v", mode, withMinted)
			require.LessOrEqual(t, read["api_keys"], 2*2000+200, "%s, with minted %v: rows of api_keys read", mode,
				withMinted)
		}
	}
}
