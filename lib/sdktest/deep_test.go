package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// The API takes a body nested 10 000 levels deep, so an input of 9 999
// levels; a claim answer carries it three levels down, deeper than
// encoding/json reads: the Go worker could not read the claim, and every
// job in it (here the shallow one too) lapsed unrun, and came back at every
// claim.
func TestGoWorkerRunsADeepInputBesideItsClaimsOtherJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	deep := json.RawMessage(strings.Repeat("[", 9999) + `"leaf"` + strings.Repeat("]", 9999))
	run, err := b.producer.StartRun(ctx, "deep input")
	require.NoError(t, err)
	var steps []string
	for _, input := range []json.RawMessage{deep, json.RawMessage(`["leaf"]`)} {
		res, err := b.producer.Enqueue(ctx, run.ID, input, ratchet.EnqueueOptions{Name: "deep", Version: "1"})
		require.NoError(t, err)
		steps = append(steps, res.StepID)
	}
	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)

	var mu sync.Mutex
	var seen []json.RawMessage
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "deep@1"), nil))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[json.RawMessage, json.RawMessage]{Name: "deep", Version: "1",
		Handler: func(_ context.Context, in json.RawMessage, _ ratchet.JobContext) (json.RawMessage, error) {
			mu.Lock()
			seen = append(seen, in)
			mu.Unlock()
			return in, nil // as deep: its report's body nests 10 000 levels
		}}))
	errs := start(t, w, 2) // both jobs in one claim
	done := waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	require.Equal(t, ratchet.RunSucceeded, done.Status, "%+v", errs.list)
	for _, id := range steps {
		s := step(t, done, id)
		require.Equal(t, ratchet.JobSucceeded, s.Status)
		require.Equal(t, 1, s.DurableJob.Attempt, "one attempt: no lease lapsed")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	require.True(t, bytes.Equal(seen[0], deep) || bytes.Equal(seen[1], deep), "the deep input reached its handler as sent")
}
