package jobs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

func TestServiceSmoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runID := b.run(t)
	res, err := b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		Input: json.RawMessage(`{"a":1}`)})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", res.Status)
	wid := b.register(t)
	c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(5)})
	require.NoError(t, err)
	require.Len(t, c.Jobs, 1)
}
