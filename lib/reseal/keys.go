package reseal

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/seal"
)

// The table seal_keys (migration 0059) lists the ids of the keys stored
// values may be sealed with: each key that sealed since, recorded by the
// sweeper of an instance whose current key it was (MissingKeys), and each
// key a count found (Check), less those a complete count forgot. It lets an
// instance learn, in one small read, that a key still in use is missing
// from its settings: removed from RESULT_ENCRYPTION_KEYS before a reseal
// reported complete. A key it lists may have nothing left sealed with it
// (the rows deleted by retention since): a count (reseal -check) that
// finds everything under the current key forgets it.

// sqlMissingKeys records $1 (the current key's id) and answers the
// recorded ids that are none of $2 (every configured key's id). The insert
// writes nothing once the id is there, as it is from the first pass on.
const sqlMissingKeys = `
WITH recorded AS (
    INSERT INTO seal_keys (key_id) VALUES ($1::text) ON CONFLICT (key_id) DO NOTHING
)
SELECT key_id FROM seal_keys WHERE NOT key_id = ANY ($2::text[]) ORDER BY key_id`

// MissingKeys records sealer's current key in seal_keys, as one that seals
// from now on, and answers the ids recorded there that sealer does not
// have: values sealed with those keys cannot be read here. One statement
// over a table of a few rows (the sweeper runs it every pass).
func MissingKeys(ctx context.Context, q db.Querier, sealer *seal.Sealer) ([]string, error) {
	id := sealer.CurrentKeyID()
	var configured []string
	for _, h := range sealer.Headers() {
		configured = append(configured, seal.KeyIDOf(h))
	}
	rows, err := q.Query(ctx, sqlMissingKeys, fmt.Sprintf("%x", id[:]), configured)
	if err != nil {
		return nil, fmt.Errorf("seal keys: %w", err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("seal keys: %w", err)
	}
	return missing, nil
}

// MissingKeysError is the sweeper's seal.keys task failing: stored values
// may be sealed with keys this instance is not configured with.
type MissingKeysError struct{ IDs []string }

func (e *MissingKeysError) Error() string {
	return fmt.Sprintf("values may be sealed with key id(s) %s, which this instance is not configured with "+
		"(RESULT_ENCRYPTION_KEY, RESULT_ENCRYPTION_KEYS): reads of them fail until the key is configured again; "+
		"reseal -check counts what each key sealed, and forgets the keys nothing is sealed with once it reports complete",
		strings.Join(e.IDs, ", "))
}

// sqlRecordKeys records the key ids a count found ($1) and, when it found
// everything under the current key ($2), forgets every other id ($3: the
// current one). The delete reads the table as it was before the insert,
// which adds only found ids: when complete, the current one alone.
const sqlRecordKeys = `
WITH found AS (
    INSERT INTO seal_keys (key_id) SELECT unnest($1::text[]) ON CONFLICT (key_id) DO NOTHING
)
DELETE FROM seal_keys WHERE $2::boolean AND key_id <> $3::text`

// recordKeys brings seal_keys up to what a count found: the ids of the
// keys it found values sealed with (configured or not; ids only, from
// well-formed headers) and, when it found every value under the current
// key, only that one: the older keys can go, and an instance without them
// no longer fails its seal.keys task for them.
func (r *Resealer) recordKeys(ctx context.Context, found map[string]bool, complete bool) error {
	ids := make([]string, 0, len(found))
	for id := range found {
		ids = append(ids, id)
	}
	if _, err := r.pool.Exec(ctx, sqlRecordKeys, ids, complete, r.currentKeyID()); err != nil {
		return fmt.Errorf("reseal: record key ids: %w", err)
	}
	return nil
}
