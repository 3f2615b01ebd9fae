package auth_test

import (
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/testpg"
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
