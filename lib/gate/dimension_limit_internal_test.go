package gate

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/money"
)

// A dimension limit's number that is no integer (1.5) or out of its
// type's range is told the field's bounds, as every other bounded integer
// field is (ops QA: it read only "must be an integer or null"); a string
// is told its type.
func TestDimensionLimitNamesItsBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, sub, msg string }{
		{`{"daily_micros":1.5}`, ".daily_micros", money.Rule + ", or null"},
		{`{"daily_micros":10000000000000000000}`, ".daily_micros", money.Rule + ", or null"},
		{`{"daily_count":2.5}`, ".daily_count", "must be an integer of at least 1, or null"},
		{`{"daily_count":"3"}`, ".daily_count", "must be an integer or null"},
	} {
		_, sub, err := decodeDimensionLimit(json.RawMessage(c.raw))
		require.Equal(t, c.sub, sub, c.raw)
		require.EqualError(t, err, c.msg, c.raw)
	}
}
