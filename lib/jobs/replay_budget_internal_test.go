package jobs

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A replay preview counts compiling each target's schema against its
// budget, not only checking the input against it (review: a preview
// compiled every target it listed and every older one it read on, each up
// to about 0.15 s, however little their checks evaluated). Counted whether
// or not the cache holds the schema, so the answer does not depend on it:
// here one schema of 4 991 parts, compiled once, whose check of a number
// evaluates 4 991 subschemas (its anyOf's first branch accepts it), is
// checked far fewer times than those evaluations alone would allow.
func TestAReplayPreviewCountsCompilingItsTargets(t *testing.T) {
	t.Parallel()
	branches := make([]string, 4_990)
	for i := range branches {
		branches[i] = `{"minLength":1}`
	}
	schema := json.RawMessage(`{"anyOf":[` + strings.Join(branches, ",") + `]}`)
	require.NoError(t, publishableSchema(schema))
	perCompile := compileEvaluations(schema)
	require.Greater(t, perCompile, int64(12*4_990))

	b := newFitBudget()
	checked := 0
	for range 300 {
		problems, ok, err := b.fit(schema, json.RawMessage(`1`))
		require.NoError(t, err)
		if !ok {
			break
		}
		require.Empty(t, problems)
		checked++
	}
	// Each check costs its compile and 4 991 evaluations: about 23 fit.
	require.Equal(t, int(MaxCheckEvaluations/(perCompile+4_991)), checked)
	_, ok, err := b.fit(json.RawMessage(`true`), json.RawMessage(`1`))
	require.NoError(t, err)
	require.False(t, ok, "once spent, nothing more is checked, nor compiled")
}
