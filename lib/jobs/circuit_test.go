package jobs_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/jobs"
)

// circuitEndpoint creates send_email's endpoint with its breaker on.
func (b *bundle) circuitEndpoint(t testing.TB, threshold int64, cooldownMs int64) jobs.Endpoint {
	t.Helper()
	ep, created, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email",
		PolicyFields: jobs.PolicyFields{CircuitFailureThreshold: opt(threshold), CircuitCooldownMs: opt(cooldownMs)}})
	require.NoError(t, err)
	require.True(t, created)
	return ep
}

func (b *bundle) endpoint(t testing.TB, id string) jobs.Endpoint {
	t.Helper()
	ep, err := b.svc.GetEndpoint(ctx, b.ws, id)
	require.NoError(t, err)
	return ep
}

// circuitEvents answers the data of the endpoint's circuit events of typ,
// oldest first.
func (b *bundle) circuitEvents(t testing.TB, endpointID, typ string) []map[string]any {
	t.Helper()
	rows, err := b.env.App.Pool.Query(ctx, `SELECT data FROM events WHERE workspace_id = $1 AND subject_id = $2
		AND type = $3 ORDER BY created_at, id`, b.ws, endpointID, typ)
	require.NoError(t, err)
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var d map[string]any
		require.NoError(t, rows.Scan(&d))
		out = append(out, d)
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *bundle) enqueueN(t testing.TB, n int) {
	t.Helper()
	runID := b.run(t)
	for i := range n {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
	}
}

var notRetryable = &jobs.ReportError{Message: "bad input", Retryable: ptr(false)}

func TestEndpointCircuitOpensHoldsClaimsAndProbesOncePerCooldown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 3, 10_000)
	require.Equal(t, 3, *ep.CircuitFailureThreshold)
	require.Equal(t, int64(10_000), ep.CircuitCooldownMs)
	require.Equal(t, jobs.CircuitClosed, ep.Circuit.State)
	b.enqueueN(t, 6)
	w := b.register(t)

	got := b.claim(t, w, 3)
	require.Len(t, got, 3)
	b.fail(t, got[0], nil)
	b.fail(t, got[1], &jobs.ReportError{Message: "503"})
	ep = b.endpoint(t, ep.ID)
	require.Equal(t, jobs.CircuitClosed, ep.Circuit.State)
	require.Equal(t, 2, ep.Circuit.ConsecutiveFailures)
	b.clock.Add(time.Second)
	opened := b.clock.Now()
	res := b.fail(t, got[2], nil)
	require.Equal(t, "RETRY_SCHEDULED", res.Status, "the breaker never changes a job's own retry")

	ep = b.endpoint(t, ep.ID)
	require.Equal(t, jobs.CircuitOpen, ep.Circuit.State)
	require.Equal(t, 3, ep.Circuit.ConsecutiveFailures)
	require.Equal(t, opened, *ep.Circuit.OpenedAt)
	require.Equal(t, opened.Add(10*time.Second), *ep.Circuit.ProbeAt)
	tripped := b.circuitEvents(t, ep.ID, "circuit.tripped")
	require.Len(t, tripped, 1)
	require.Equal(t, ep.ID, tripped[0]["endpointId"])
	require.Equal(t, "send_email", tripped[0]["endpoint"])
	require.EqualValues(t, 3, tripped[0]["consecutiveFailures"])

	// Open: three jobs are due, none is leased, no attempt is consumed.
	require.Empty(t, b.claim(t, w, 10))
	health, err := b.svc.QueueHealth(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Len(t, health, 1)
	require.Equal(t, []string{"send_email"}, health[0].OpenCircuitEndpoints)
	require.Empty(t, health[0].PausedEndpoints)
	require.Contains(t, *health[0].Message, "The circuit of endpoint send_email is open")
	b.clock.Add(9 * time.Second)
	require.Empty(t, b.claim(t, w, 10))

	// The cooldown passed: one probe, whatever the claim's limit.
	b.clock.Add(time.Second)
	probe := b.claim(t, w, 10)
	require.Len(t, probe, 1)
	require.Equal(t, 1, probe[0].Attempt)
	require.Empty(t, b.claim(t, w, 10), "one probe per cooldown")
	require.Equal(t, b.clock.Now().Add(10*time.Second), *b.endpoint(t, ep.ID).Circuit.ProbeAt)

	// The probe fails: still open, since it opened, and the cooldown restarts.
	b.clock.Add(2 * time.Second)
	b.fail(t, probe[0], nil)
	ep = b.endpoint(t, ep.ID)
	require.Equal(t, jobs.CircuitOpen, ep.Circuit.State)
	require.Equal(t, opened, *ep.Circuit.OpenedAt)
	require.Equal(t, b.clock.Now().Add(10*time.Second), *ep.Circuit.ProbeAt)
	require.Equal(t, 4, ep.Circuit.ConsecutiveFailures)
	b.clock.Add(9 * time.Second)
	require.Empty(t, b.claim(t, w, 10))
	require.Len(t, b.circuitEvents(t, ep.ID, "circuit.tripped"), 1, "still the one opening")

	// The next probe succeeds: the circuit closes and the jobs flow.
	b.clock.Add(time.Second)
	probe = b.claim(t, w, 10)
	require.Len(t, probe, 1)
	b.succeed(t, probe[0])
	ep = b.endpoint(t, ep.ID)
	require.Equal(t, jobs.CircuitClosed, ep.Circuit.State)
	require.Nil(t, ep.Circuit.OpenedAt)
	require.Nil(t, ep.Circuit.ProbeAt)
	require.Zero(t, ep.Circuit.ConsecutiveFailures)
	closed := b.circuitEvents(t, ep.ID, "circuit.closed")
	require.Len(t, closed, 1)
	require.Equal(t, "success", closed[0]["closedBy"])
	require.Equal(t, opened.Format(time.RFC3339Nano), closed[0]["openedAt"])
	untried := b.claim(t, w, 10)
	require.Len(t, untried, 1, "the job never tried")
	b.succeed(t, untried[0])
	b.clock.Add(time.Minute)
	require.Len(t, b.claim(t, w, 10), 4, "the four failed ones, due again")
}

func TestEndpointCircuitCountsConsecutiveRetryableFailuresOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email"})
	require.NoError(t, err)
	b.enqueueN(t, 8)
	w := b.register(t)
	got := b.claim(t, w, 8)
	require.Len(t, got, 8)

	// The breaker is off: nothing is counted.
	b.fail(t, got[0], nil)
	require.Zero(t, b.endpoint(t, ep.ID).Circuit.ConsecutiveFailures)

	ep, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt[int64](1),
		PolicyFields: jobs.PolicyFields{CircuitFailureThreshold: opt[int64](2)}})
	require.NoError(t, err)
	require.Equal(t, int64(jobs.DefaultCircuitCooldownMs), ep.CircuitCooldownMs)
	failures := func() int { return b.endpoint(t, ep.ID).Circuit.ConsecutiveFailures }
	b.fail(t, got[1], nil)
	require.Equal(t, 1, failures())
	b.fail(t, got[2], notRetryable)
	require.Equal(t, 1, failures(), "a non-retryable failure is about its input")
	b.succeed(t, got[3])
	require.Zero(t, failures(), "a success resets the count")
	b.fail(t, got[4], nil)
	require.Equal(t, jobs.CircuitClosed, b.endpoint(t, ep.ID).Circuit.State)

	// In a batch, only the failures after its last success count.
	batch, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
		{JobID: got[5].JobID, LeaseToken: got[5].LeaseToken, Status: "FAILED"},
		{JobID: got[6].JobID, LeaseToken: got[6].LeaseToken, Status: "SUCCEEDED"},
		{JobID: got[7].JobID, LeaseToken: got[7].LeaseToken, Status: "FAILED"},
	}})
	require.NoError(t, err)
	for _, r := range batch.Results {
		require.Nil(t, r.Error)
	}
	ep = b.endpoint(t, ep.ID)
	require.Equal(t, 1, ep.Circuit.ConsecutiveFailures)
	require.Equal(t, jobs.CircuitClosed, ep.Circuit.State)
	require.Empty(t, b.circuitEvents(t, ep.ID, "circuit.tripped"))
}

func TestEndpointCircuitClosedByOperatorOrByTurningTheBreakerOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 1, 3_600_000)
	b.enqueueN(t, 4)
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), nil)
	require.Equal(t, jobs.CircuitOpen, b.endpoint(t, ep.ID).Circuit.State)
	require.Empty(t, b.claim(t, w, 10))

	closed, err := b.svc.CloseCircuit(ctx, b.ws, ep.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.CircuitClosed, closed.Circuit.State)
	require.Zero(t, closed.Circuit.ConsecutiveFailures)
	require.Nil(t, closed.Circuit.ProbeAt)
	events := b.circuitEvents(t, ep.ID, "circuit.closed")
	require.Len(t, events, 1)
	require.Equal(t, "operator", events[0]["closedBy"])
	again, err := b.svc.CloseCircuit(ctx, b.ws, ep.ID)
	require.NoError(t, err)
	require.Equal(t, closed, again, "closing a closed circuit changes nothing")
	require.Len(t, b.circuitEvents(t, ep.ID, "circuit.closed"), 1)

	// It opens again on the next failure; turning the breaker off closes it.
	b.clock.Add(time.Second)
	b.fail(t, b.claimOne(t, w), nil)
	require.Equal(t, jobs.CircuitOpen, b.endpoint(t, ep.ID).Circuit.State)
	require.Len(t, b.circuitEvents(t, ep.ID, "circuit.tripped"), 2)
	off, err := b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(closed.Version),
		PolicyFields: jobs.PolicyFields{CircuitFailureThreshold: null[int64]()}})
	require.NoError(t, err)
	require.Nil(t, off.CircuitFailureThreshold)
	require.Equal(t, jobs.CircuitClosed, off.Circuit.State)
	require.Zero(t, off.Circuit.ConsecutiveFailures)
	events = b.circuitEvents(t, ep.ID, "circuit.closed")
	require.Len(t, events, 2)
	require.Equal(t, "policy", events[1]["closedBy"])
	require.Len(t, b.claim(t, w, 10), 2)

	_, err = b.svc.CloseCircuit(ctx, b.ws, "ep_missing")
	require.Equal(t, "not_found", code(t, err))
}

func TestEndpointCircuitPolicyFieldsAreValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		field  string
		fields jobs.PolicyFields
	}{
		{"circuitFailureThreshold", jobs.PolicyFields{CircuitFailureThreshold: opt[int64](0)}},
		{"circuitFailureThreshold", jobs.PolicyFields{CircuitFailureThreshold: opt[int64](1001)}},
		{"circuitCooldownMs", jobs.PolicyFields{CircuitCooldownMs: opt[int64](999)}},
		{"circuitCooldownMs", jobs.PolicyFields{CircuitCooldownMs: opt[int64](86_400_001)}},
		{"circuitCooldownMs", jobs.PolicyFields{CircuitCooldownMs: null[int64]()}},
	} {
		_, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "svc", PolicyFields: tc.fields})
		require.Equal(t, "invalid_request", code(t, err), tc.field)
		require.Contains(t, err.Error(), tc.field)
	}
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	require.Empty(t, eps, "a refused create writes nothing")
}

// Concurrent failing reports are each counted (the count is kept under the
// endpoint's row lock), and the circuit opens once.
func TestEndpointCircuitConcurrentFailuresOpenItOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 5, 60_000)
	const n = 40
	b.enqueueN(t, n)
	w := b.register(t)
	got := b.claim(t, w, n)
	require.Len(t, got, n)
	var wg sync.WaitGroup
	for i, j := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%4 == 0 { // some in batches of one, others alone
				_, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
					{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: "FAILED"}}})
				assert.NoError(t, err)
				return
			}
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED"})
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	ep = b.endpoint(t, ep.ID)
	require.Equal(t, jobs.CircuitOpen, ep.Circuit.State)
	require.Equal(t, n, ep.Circuit.ConsecutiveFailures)
	require.Len(t, b.circuitEvents(t, ep.ID, "circuit.tripped"), 1)
}

// However many claims race once the cooldown has passed, one probe is
// leased.
func TestEndpointCircuitConcurrentClaimsLeaseOneProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 1, 1_000)
	b.enqueueN(t, 30)
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), nil)
	require.Equal(t, jobs.CircuitOpen, b.endpoint(t, ep.ID).Circuit.State)
	b.clock.Add(time.Second)

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		leased int
	)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			limit := 10
			c, err := b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{Limit: &limit})
			if assert.NoError(t, err) {
				mu.Lock()
				leased += len(c.Jobs)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, leased)
}

// An operator's close that waits for a report tripping the circuit closes
// it after it opened: its clock is read once it holds the endpoint's row,
// not before. Read before (the close's first act, before its transaction
// began), a close whose clock read 12:00:00 and that then waited for the
// row while a report opened the circuit at 12:00:01 recorded circuit.closed
// with closedAt 12:00:00, before that event's own openedAt, and moved the
// endpoint's updatedAt back (review). The report runs in a request's
// transaction (an Idempotency-Key request's, db.BeginRequest) that has
// locked the row first, as the report's own first statement does, so the
// close is seen waiting before the report reads its clock.
func TestACircuitClosedWhileAReportOpensItClosesAfterItOpened(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 1, 3_600_000)
	b.enqueueN(t, 1)
	j := b.claimOne(t, b.register(t))

	pool := b.env.App.Pool
	reqCtx, report := db.BeginRequest(ctx, pool)
	defer func() { _ = report.Rollback(context.Background()) }()
	var pid int
	require.NoError(t, report.QueryRow(reqCtx, `SELECT pg_backend_pid() FROM job_endpoints WHERE id = $1
		FOR NO KEY UPDATE`, ep.ID).Scan(&pid))
	waits := apitest.NewLockWaits(t, pool, pid)

	var (
		closed   jobs.Endpoint
		closeErr error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		closed, closeErr = b.svc.CloseCircuit(ctx, b.ws, ep.ID)
	}()
	waits.Waiting(done, "the close waits for the report's hold on the endpoint's row")

	b.clock.Add(time.Second)
	opened := b.clock.Now()
	_, err := b.svc.Report(reqCtx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED"})
	require.NoError(t, err)
	require.NoError(t, report.Commit(ctx))
	<-done
	require.NoError(t, closeErr)

	require.Equal(t, jobs.CircuitClosed, closed.Circuit.State)
	require.False(t, closed.UpdatedAt.Before(opened), "updatedAt moved back past the report's: %v", closed.UpdatedAt)
	events := b.circuitEvents(t, ep.ID, "circuit.closed")
	require.Len(t, events, 1)
	require.Equal(t, "operator", events[0]["closedBy"])
	openedAt, err := time.Parse(time.RFC3339Nano, events[0]["openedAt"].(string))
	require.NoError(t, err)
	closedAt, err := time.Parse(time.RFC3339Nano, events[0]["closedAt"].(string))
	require.NoError(t, err)
	require.True(t, openedAt.Equal(opened), "openedAt %v, want the report's %v", openedAt, opened)
	require.False(t, closedAt.Before(openedAt), "closedAt %v precedes openedAt %v", closedAt, openedAt)
}

// Every opening and closing of an endpoint's circuit is announced, also
// one whose clock reads the instant an earlier transition of it read (as
// the gate's breakers are: TestEachCircuitTransitionIsAnnouncedUnderOneClockReading).
// Keyed by that instant, the second cycle's trip took the first trip's key
// and its close the first close's (both opened at that instant), and
// neither was announced (events QA).
func TestEachEndpointCircuitTransitionIsAnnouncedUnderOneClockReading(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := b.circuitEndpoint(t, 1, 3_600_000)
	b.enqueueN(t, 2)
	w := b.register(t)
	for range 2 {
		b.fail(t, b.claimOne(t, w), nil)
		require.Equal(t, jobs.CircuitOpen, b.endpoint(t, ep.ID).Circuit.State)
		_, err := b.svc.CloseCircuit(ctx, b.ws, ep.ID)
		require.NoError(t, err)
	}
	require.Len(t, b.circuitEvents(t, ep.ID, "circuit.tripped"), 2)
	require.Len(t, b.circuitEvents(t, ep.ID, "circuit.closed"), 2)
}
