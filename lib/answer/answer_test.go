package answer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Within only narrows what an answer may hold, never below a byte.
func TestWithinOnlyNarrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Equal(t, Budget, Of(ctx))
	require.Equal(t, 1000, Of(Within(ctx, 1000)))
	require.Equal(t, 1000, Of(Within(Within(ctx, 1000), 5000)), "a wider budget does not widen it")
	require.Equal(t, 10, Of(Within(Within(ctx, 1000), 10)))
	require.Equal(t, Budget, Of(Within(ctx, Budget+1)))
	require.Equal(t, 1, Of(Within(ctx, -5)))
}
