package httpapi_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
)

// The emergency stop and its release answer every circuit of the
// workspace, as a page: past gate.MaxCircuitsAnswered types the answer
// ends with a next_cursor, from which GET /api/v1/circuits reads the rest,
// each held by the stop (closed after its release). QA: the answer held the first 200 and said
// next_cursor null, as if they were every type.
func TestTheStopsAnswerSaysWhenTypesAreLeftOut(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for i := range gate.MaxCircuitsAnswered {
		env.Must(http.StatusOK, "PUT", fmt.Sprintf("/api/v1/policies/t.%03d", i), ws.Key, map[string]any{"mode": "allow"})
	}
	type page struct {
		Data       []gate.Circuit `json:"data"`
		NextCursor *string        `json:"next_cursor"`
	}
	// rest reads GET /api/v1/circuits from cursor to its last page.
	rest := func(cursor *string) []gate.Circuit {
		var out []gate.Circuit
		for cursor != nil {
			var p page
			env.Must(http.StatusOK, "GET", "/api/v1/circuits?limit=200&cursor="+url.QueryEscape(*cursor), ws.Key, nil).
				Decode(t, &p)
			out, cursor = append(out, p.Data...), p.NextCursor
		}
		return out
	}
	first := ""
	every := len(rest(&first))
	require.Greater(t, every, gate.MaxCircuitsAnswered)
	for path, state := range map[string]string{"/api/v1/circuits/stop": "open", "/api/v1/circuits/release": "closed"} {
		var answer page
		env.Must(http.StatusOK, "POST", path, ws.Key, nil).Decode(t, &answer)
		require.Len(t, answer.Data, gate.MaxCircuitsAnswered, path)
		require.NotNil(t, answer.NextCursor, "%s: more types than the answer holds", path)
		after := rest(answer.NextCursor)
		for _, c := range append(answer.Data, after...) {
			require.Equal(t, state, c.State, "%s: %s", path, c.EffectType)
		}
		require.Equal(t, every, len(answer.Data)+len(after), "%s: its answer and the pages after it hold every type", path)
	}
}
