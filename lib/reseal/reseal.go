// Package reseal completes a rotation of RESULT_ENCRYPTION_KEY. Sealing with
// key ids (lib/seal) lets a new key take over at once while the old one still
// opens what it sealed; this package re-seals, under the current key, every
// ciphertext still sealed with another one, so the old key can then be
// removed from RESULT_ENCRYPTION_KEYS without losing anything. Check reports
// where each column's ciphertexts stand without changing them, and keeps
// the table of key ids in use (seal_keys) up to what it found.
//
// A run is safe beside live traffic and safe to repeat or interrupt: it
// walks each column in primary-key order, a batch at a time, and replaces a
// ciphertext only while the row still holds the one it read (a row changed in
// between is left for the next run, and was written under the current key
// anyway). It takes each batch's rows with SKIP LOCKED, so it never waits for
// a request, and a request waits at most for one batch's statement.
package reseal

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/seal"
)

// column is one column of ciphertexts: its table, its name, and the
// primary-key columns its associated data is derived from.
type column struct {
	table string
	name  string
	// key is the primary key, in order; keyType the SQL type of each part.
	key     []string
	keyType []string
	// aad derives the column's associated data from the key's values,
	// exactly as the code that sealed it did.
	aad func(key []string) []byte
}

// rowAAD is the associated data of a column sealed as seal.AAD(id, part).
func rowAAD(part string) func([]string) []byte {
	return func(key []string) []byte { return seal.AAD(key[0], part) }
}

// columns lists every sealed column. A new sealed column belongs here, or a
// rotation would strand it (TestEveryByteaColumnIsKnown lists the rest).
var columns = []column{
	{table: "effects", name: "payload", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("payload")},
	{table: "effects", name: "result", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("result")},
	{table: "effects", name: "compensation", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("compensation")},
	{table: "jobs", name: "input_sealed", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("input")},
	{table: "jobs", name: "output_sealed", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("output")},
	// An attempt's error is sealed under the job's id and "error/<attempt>".
	{table: "job_executions", name: "error_sealed", key: []string{"job_id", "attempt"},
		keyType: []string{"text", "integer"}, aad: func(key []string) []byte {
			return seal.AAD(key[0], "error/"+key[1])
		}},
	{table: "webhooks", name: "secret", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("secret")},
	// A rotated secret, moved from secret as it was sealed (migration 0050).
	{table: "webhooks", name: "previous_secret", key: []string{"id"}, keyType: []string{"text"}, aad: rowAAD("secret")},
	// A create's answer kept for its Idempotency-Key (a day at most).
	{table: "idempotent_requests", name: "answer", key: []string{"key_id", "idempotency_key"},
		keyType: []string{"text", "text"}, aad: func(key []string) []byte {
			return idempotency.AnswerAAD(key[0], key[1])
		}},
}

// BatchSize is how many rows one statement re-seals. Ciphertexts are read
// into memory a batch at a time; a sealed value is at most a request body.
const BatchSize = 64

// ColumnReport is what one column holds, or what a run did to it.
type ColumnReport struct {
	Column string `json:"column"` // table.column
	// Run: Resealed counts ciphertexts moved to the current key; Skipped
	// those a request held, changed or deleted while the run read them (a
	// later run takes those still there); Corrupt those that fail to open
	// under the configured key they name, or are no ciphertext of this
	// format (Report.Damaged names them). The closing count counts the
	// corrupt ones too, by their header: as older (or unknown, when no
	// ciphertext).
	Resealed int64 `json:"resealed"`
	Skipped  int64 `json:"skipped"`
	Corrupt  int64 `json:"corrupt"`
	// Current and Older count ciphertexts under the current key and under
	// an older configured one, Unknown those under a key that is not
	// configured, which nothing can open: as Check finds them (at the end
	// of a Run, after it; a Run stopped before then leaves them zero and
	// Report.Counted false).
	Current int64 `json:"current"`
	Older   int64 `json:"older"`
	Unknown int64 `json:"unknown"`
}

// Report covers every sealed column.
type Report struct {
	CurrentKeyID string         `json:"currentKeyId"`
	Columns      []ColumnReport `json:"columns"`
	// Complete is true when nothing is sealed with a key other than the
	// current one: the older keys can be removed.
	Complete bool `json:"complete"`
	// Counted is true when the columns' Current, Older and Unknown were
	// counted: false for a Run stopped (interrupted, or its time up) before
	// its closing count, whose zeros say nothing.
	Counted bool `json:"counted"`
	// Damaged names the first MaxDamaged values a Run found corrupt, in
	// column order (the columns' Corrupt count them all): no key mends
	// them, so they keep the rotation incomplete until each is nulled or
	// its row deleted (README, Rotating RESULT_ENCRYPTION_KEY). Check opens
	// nothing and names none.
	Damaged []DamagedValue `json:"damaged"`
}

// MarshalJSON writes Columns and Damaged as [] when they hold nothing, as
// README promises ("[]" for none): a report of a run stopped before it
// started (interrupted, or its Lambda time up, while it connected) has
// neither, and answered "damaged": null (QA).
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report // without this method
	p := plain(r)
	if p.Columns == nil {
		p.Columns = []ColumnReport{}
	}
	if p.Damaged == nil {
		p.Damaged = []DamagedValue{}
	}
	return json.Marshal(p)
}

// MaxDamaged bounds Report.Damaged.
const MaxDamaged = 100

// DamagedValue names a sealed value that cannot be opened: its row's table
// and primary key, and its column, never the value nor anything of a key.
type DamagedValue struct {
	Table  string `json:"table"`
	Column string `json:"column"`
	// Key is the row's primary key, as text by column: {"id": "eff_…"};
	// job_executions {"job_id", "attempt"}; idempotent_requests {"key_id"
	// (the API key's id), "idempotency_key"}.
	Key map[string]string `json:"key"`
}

// String is the value as the command prints it: table.column and the key
// by column in name order, each value quoted as Go does.
func (d DamagedValue) String() string {
	names := make([]string, 0, len(d.Key))
	for k := range d.Key {
		names = append(names, k)
	}
	slices.Sort(names)
	out := d.Table + "." + d.Column
	for _, k := range names {
		out += " " + k + "=" + strconv.Quote(d.Key[k])
	}
	return out
}

func (r *Report) finish() {
	r.Counted, r.Complete = true, true
	for _, c := range r.Columns {
		if c.Older+c.Unknown+c.Corrupt > 0 {
			r.Complete = false
		}
	}
}

// Resealer re-seals one database's ciphertexts with one Sealer's keys.
type Resealer struct {
	pool   *pgxpool.Pool
	sealer *seal.Sealer
	batch  int
	// maxDamaged bounds Report.Damaged (MaxDamaged; tests set less).
	maxDamaged int
	// beforeWrite, when set (tests), runs between a batch's read and write.
	beforeWrite func(column string)
}

// New returns a Resealer. The sealer's current key seals; its older keys
// must include every key still in use, or those ciphertexts count as unknown.
func New(pool *pgxpool.Pool, sealer *seal.Sealer) *Resealer {
	return &Resealer{pool: pool, sealer: sealer, batch: BatchSize, maxDamaged: MaxDamaged}
}

// Check counts each column's ciphertexts by the key that sealed them,
// changing none. It reads every sealed value's 5-byte header only. It
// records the key ids it found in seal_keys (keys.go), and when it found
// every value under the current key, forgets the others there.
func (r *Resealer) Check(ctx context.Context) (Report, error) {
	rep := Report{CurrentKeyID: r.currentKeyID(), Damaged: []DamagedValue{}}
	found := map[string]bool{}
	for _, c := range columns {
		cr := ColumnReport{Column: c.table + "." + c.name}
		rows, err := r.pool.Query(ctx, c.countSQL())
		if err != nil {
			return rep, fmt.Errorf("reseal: count %s: %w", cr.Column, err)
		}
		var header []byte
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&header, &n}, func() error {
			if id := seal.KeyIDOf(header); id != "" {
				found[id] = true
			}
			switch {
			case r.sealer.IsCurrent(header):
				cr.Current += n
			case r.sealer.CanOpen(header):
				cr.Older += n
			default:
				cr.Unknown += n
			}
			return nil
		})
		if err != nil {
			return rep, fmt.Errorf("reseal: count %s: %w", cr.Column, err)
		}
		rep.Columns = append(rep.Columns, cr)
	}
	rep.finish()
	return rep, r.recordKeys(ctx, found, rep.Complete)
}

// Run re-seals every ciphertext not sealed with the current key. It stops
// at ctx's end with what it did so far (a later run continues: what is left
// is found again). Ciphertexts under an unknown key, or that fail to open,
// are counted and left as they are; those that fail to open are named
// (Report.Damaged).
//
// Its verdict comes from a Check after the walk: a ciphertext sealed with
// an older key behind the walk (by an instance still running the old
// settings) is counted, not missed.
func (r *Resealer) Run(ctx context.Context) (Report, error) {
	rep := Report{CurrentKeyID: r.currentKeyID(), Damaged: []DamagedValue{}}
	for _, c := range columns {
		cr, err := r.runColumn(ctx, c, &rep.Damaged)
		rep.Columns = append(rep.Columns, cr)
		if err != nil {
			return rep, err
		}
	}
	check, err := r.Check(ctx)
	if err != nil {
		return rep, err
	}
	for i, c := range check.Columns {
		rep.Columns[i].Current, rep.Columns[i].Older, rep.Columns[i].Unknown = c.Current, c.Older, c.Unknown
	}
	rep.finish()
	return rep, nil
}

// staleRow is one ciphertext not under the current key.
type staleRow struct {
	key []string
	ct  []byte
}

// runColumn re-seals column c, adding to damaged, up to r.maxDamaged, the
// values that fail to open.
func (r *Resealer) runColumn(ctx context.Context, c column, damaged *[]DamagedValue) (ColumnReport, error) {
	cr := ColumnReport{Column: c.table + "." + c.name}
	current := r.sealer.CurrentKeyID()
	// The last key read: before the first batch, a key below every real
	// one (ids are never empty, attempts start at 1).
	after := make([]string, len(c.key))
	for i, t := range c.keyType {
		if t == "integer" {
			after[i] = "0"
		}
	}
	for {
		args := []any{current[:], r.batch}
		for _, v := range after {
			args = append(args, v)
		}
		rows, err := r.pool.Query(ctx, c.staleSQL(), args...)
		if err != nil {
			return cr, fmt.Errorf("reseal: read %s: %w", cr.Column, err)
		}
		stale, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (staleRow, error) {
			s := staleRow{key: make([]string, len(c.key))}
			dest := make([]any, 0, len(c.key)+1)
			for i := range s.key {
				dest = append(dest, &s.key[i])
			}
			return s, row.Scan(append(dest, &s.ct)...)
		})
		if err != nil {
			return cr, fmt.Errorf("reseal: read %s: %w", cr.Column, err)
		}
		if len(stale) == 0 {
			return cr, nil
		}
		after = stale[len(stale)-1].key

		keys := make([][]string, len(c.key))
		var olds, news [][]byte
		for _, s := range stale {
			pt, err := r.sealer.Open(s.ct, c.aad(s.key))
			switch {
			case errors.Is(err, seal.ErrUnknownKey):
				continue // counted by the Check that ends the run
			case err != nil:
				cr.Corrupt++
				if len(*damaged) < r.maxDamaged {
					*damaged = append(*damaged, c.damaged(s.key))
				}
				continue
			}
			for i := range keys {
				keys[i] = append(keys[i], s.key[i])
			}
			olds = append(olds, s.ct)
			news = append(news, r.sealer.Seal(pt, c.aad(s.key)))
		}
		if len(olds) == 0 {
			continue
		}
		if r.beforeWrite != nil {
			r.beforeWrite(c.table + "." + c.name)
		}
		args = args[:0]
		for _, k := range keys {
			args = append(args, k)
		}
		tag, err := r.pool.Exec(ctx, c.replaceSQL(), append(args, olds, news)...)
		if err != nil {
			return cr, fmt.Errorf("reseal: write %s: %w", cr.Column, err)
		}
		cr.Resealed += tag.RowsAffected()
		cr.Skipped += int64(len(olds)) - tag.RowsAffected()
	}
}

// damaged names the value of c in the row of primary key key.
func (c column) damaged(key []string) DamagedValue {
	d := DamagedValue{Table: c.table, Column: c.name, Key: map[string]string{}}
	for i, k := range c.key {
		d.Key[k] = key[i]
	}
	return d
}

func (r *Resealer) currentKeyID() string { return keyIDText(r.sealer) }

func keyIDText(sealer *seal.Sealer) string {
	id := sealer.CurrentKeyID()
	return hex.EncodeToString(id[:])
}

// Unstarted is the report of a run or check that stopped before it read
// anything (its database not reached, its time up or interrupted while it
// connected): the configured current key id, no columns, nothing counted,
// not complete. Without it such a report answered "currentKeyId": "".
func Unstarted(sealer *seal.Sealer) Report {
	return Report{CurrentKeyID: keyIDText(sealer), Damaged: []DamagedValue{}}
}

// The statements are built from the column list above, never from input.

// countSQL groups a column's ciphertexts by their header (version and key
// id): substring reads only the first bytes of an out-of-line value.
func (c column) countSQL() string {
	return fmt.Sprintf(`SELECT substring(%[2]s FROM 1 FOR 5), count(*) FROM %[1]s
WHERE %[2]s IS NOT NULL GROUP BY 1`, c.table, c.name)
}

// staleSQL reads the next batch ($2 rows) of ciphertexts whose key id is
// not the current one ($1), in primary-key order after the previous batch's
// last key ($3…, each part sent as text).
func (c column) staleSQL() string {
	keyList := strings.Join(c.key, ", ")
	after := make([]string, len(c.key))
	for i, t := range c.keyType {
		after[i] = fmt.Sprintf("$%d::text::%s", i+3, t)
	}
	casts := make([]string, len(c.key))
	for i, k := range c.key {
		casts[i] = k + "::text"
	}
	return fmt.Sprintf(`SELECT %[3]s, %[2]s FROM %[1]s
WHERE %[2]s IS NOT NULL AND substring(%[2]s FROM 2 FOR 4) <> $1::bytea
  AND (%[4]s) > (%[5]s)
ORDER BY %[4]s LIMIT $2::int`,
		c.table, c.name, strings.Join(casts, ", "), keyList, strings.Join(after, ", "))
}

// replaceSQL swaps each row's old ciphertext for its new one while the row
// still holds the old one, taking the rows in key order and skipping any a
// request holds. Its parameters are one array per key part, then the old
// and the new ciphertexts.
func (c column) replaceSQL() string {
	n := len(c.key)
	unnest := make([]string, 0, n+2)
	names := make([]string, 0, n+2)
	match := make([]string, 0, n)
	for i, k := range c.key {
		unnest = append(unnest, fmt.Sprintf("$%d::text[]", i+1))
		names = append(names, "k"+fmt.Sprint(i))
		match = append(match, fmt.Sprintf("t.%s = u.k%d::%s", k, i, c.keyType[i]))
	}
	unnest = append(unnest, fmt.Sprintf("$%d::bytea[]", n+1), fmt.Sprintf("$%d::bytea[]", n+2))
	names = append(names, "old", "new")
	order := make([]string, n)
	for i, k := range c.key {
		order[i] = "t." + k
	}
	return fmt.Sprintf(`WITH u AS (SELECT * FROM unnest(%[3]s) AS u(%[4]s)),
locked AS (
    SELECT t.ctid AS tid, u.new FROM %[1]s t JOIN u ON %[5]s AND t.%[2]s = u.old
    ORDER BY %[6]s
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE %[1]s t SET %[2]s = locked.new FROM locked WHERE t.ctid = locked.tid`,
		c.table, c.name, strings.Join(unnest, ", "), strings.Join(names, ", "),
		strings.Join(match, " AND "), strings.Join(order, ", "))
}
