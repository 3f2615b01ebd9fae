package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
)

// A TextArray parameter cast to text[] reads back as the strings it was
// made of, whatever they hold: quotes, backslashes, the array syntax's own
// characters, spaces, NULL spelled as text, nothing at all.
func TestTextArrayReadsBackAsItsStrings(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, ss := range [][]string{
		{},
		{""},
		{"job_01m8mgjek0ze8ys743sv5h6qz5", "0123456789abcdef"},
		{`a"b`, `c\d`, `\"`, `"`, `\`, "{x,y}", " lead", "trail ", "NULL", "null", "a b", "é😀", ",", "}", "{"},
	} {
		var got []string
		require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT $1::text[]`, db.TextArray(ss)).Scan(&got))
		require.Equal(t, ss, got, "%s", db.TextArray(ss))
		var nulls int
		require.NoError(t, env.App.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM unnest($1::text[]) e WHERE e IS NULL`, db.TextArray(ss)).Scan(&nulls))
		require.Zero(t, nulls)
	}
}

func BenchmarkTextArray(b *testing.B) {
	ss := make([]string, 100)
	for i := range ss {
		ss[i] = "job_01m8mgjek0ze8ys743sv5h6qz5"
	}
	b.ReportAllocs()
	for b.Loop() {
		db.TextArray(ss)
	}
}
