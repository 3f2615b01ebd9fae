package httpapi

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

// ListParams stands behind knownQuery by the same rules (refusedValue): a
// list handler called with a query knownQuery did not see still refuses a
// limit out of range and a cursor its route's Cursor does not take, and
// reads a good query as given.
func TestListParamsRefusesByTheQueryRules(t *testing.T) {
	t.Parallel()
	route := &Route{Cursor: func(c string) bool { return c == "eff_1" }}
	call := func(query string) (int, string, error) {
		c := &Call{R: httptest.NewRequest("GET", "/api/v1/effects"+query, nil), Route: route}
		return c.ListParams()
	}
	for query, field := range map[string]string{
		"?limit=0": "limit", "?limit=201": "limit", "?limit=": "limit", "?limit=x": "limit",
		"?cursor=nope": "cursor", "?limit=5&cursor=nope": "cursor",
	} {
		_, _, err := call(query)
		var e *apierr.Error
		require.True(t, errors.As(err, &e), query)
		require.Equal(t, 400, e.Status, query)
		require.Contains(t, e.Message, "invalid: "+field+" ", query)
	}
	limit, cursor, err := call("?limit=7&cursor=eff_1")
	require.NoError(t, err)
	require.Equal(t, 7, limit)
	require.Equal(t, "eff_1", cursor)
	limit, cursor, err = call("?cursor=")
	require.NoError(t, err)
	require.Equal(t, 50, limit)
	require.Empty(t, cursor)
}
