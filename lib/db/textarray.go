package db

import "strings"

// TextArray is ss as a PostgreSQL array literal ({"a","b\"c"}), for a
// parameter the statement casts to text[] ($1::text[]). In the pool's
// QueryExecModeExec a []string parameter goes as that same text, which
// pgx writes element by element, looking at each for what needs quoting
// (three allocations an element: a report of 100 jobs sends three such
// arrays); written here every element is quoted, so one allocation makes
// the whole literal. A NULL element cannot be written: ss has none.
func TextArray(ss []string) string {
	n := 2
	for _, s := range ss {
		n += len(s) + 3 + strings.Count(s, `"`) + strings.Count(s, `\`)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
