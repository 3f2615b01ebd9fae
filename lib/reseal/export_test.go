package reseal

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/seal"
)

// SealedColumns lists the columns Run re-seals, as table.column.
func SealedColumns() []string {
	out := make([]string, len(columns))
	for i, c := range columns {
		out[i] = c.table + "." + c.name
	}
	return out
}

// BeforeWrite sets a hook run between each batch's read and its write.
func (r *Resealer) BeforeWrite(f func(column string)) { r.beforeWrite = f }

// SetMaxDamaged sets how many damaged values a Run names.
func (r *Resealer) SetMaxDamaged(n int) { r.maxDamaged = n }

// SetBatch sets how many rows one statement re-seals.
func (r *Resealer) SetBatch(n int) { r.batch = n }

// Unopenable opens every ciphertext of every sealed column with s and its
// own associated data, and returns those that fail, as table.column:key.
func Unopenable(ctx context.Context, pool *pgxpool.Pool, s *seal.Sealer) ([]string, error) {
	var failed []string
	for _, c := range columns {
		casts := make([]string, len(c.key))
		for i, k := range c.key {
			casts[i] = k + "::text"
		}
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT ARRAY[%s], %s FROM %s WHERE %[2]s IS NOT NULL`,
			strings.Join(casts, ", "), c.name, c.table))
		if err != nil {
			return nil, err
		}
		var key []string
		var ct []byte
		_, err = pgx.ForEachRow(rows, []any{&key, &ct}, func() error {
			if _, err := s.Open(ct, c.aad(key)); err != nil {
				failed = append(failed, c.table+"."+c.name+":"+strings.Join(key, "/"))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return failed, nil
}
