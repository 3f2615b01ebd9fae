package gate

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
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

// A policy's bounded integer out of its bounds is told them in the words
// a number that is no integer is (lib/jsonstrict: "must be an integer
// from 5 to 3600"): it read "must be from 5 to 3600", and a daily_count of
// 0 "must be at least 1" (and then without the decoder's ", or null").
func TestPolicyBoundsAreWordedAsTheDecoders(t *testing.T) {
	t.Parallel()
	zero := int64(0)
	p := Policy{Mode: ModeAllow, OnIndeterminate: OnIndeterminateBlock, SurgeAction: "monitor", LeaseSeconds: 3601,
		MaxAttempts: 1, SurgeCooldownSeconds: 60, RetentionDays: 1,
		DimensionLimits: map[string]DimensionLimit{"vendor": {DailyCount: &zero}}}
	var pr apierr.Problems
	p.validate(&pr)
	require.Equal(t, apierr.Problems{
		{Field: "lease_seconds", Message: "must be an integer from 5 to 3600"},
		{Field: "dimension_limits.vendor.daily_count", Message: "must be an integer of at least 1, or null"},
	}, pr)
}
