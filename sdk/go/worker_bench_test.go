package ratchet

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkWorkerWorksClaimedJobs is the work figure's worker side
// (scripts/benchratchet's ratchet.jobs.work: 64 at once, jobs claimed 100 at
// a time, reports batched) against the test's fake server in the same
// process: one op is one job claimed, run and reported. Its allocations
// include the fake's; the SDK's own are read from a memory profile
// (-memprofile, pprof -focus on the SDK's functions).
func BenchmarkWorkerWorksClaimedJobs(b *testing.B) {
	f := newFakeJobs()
	for range b.N {
		f.add("bench_noop", "1", welcomeIn{CustomerID: "cus_1"}, 30000)
	}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "test-key", HTTPClient: srv.Client()})
	if err != nil {
		b.Fatal(err)
	}
	w := NewWorker(c)
	if err := RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "bench_noop", Version: "1",
		Handler: func(ctx context.Context, in welcomeIn, job JobContext) (welcomeOut, error) {
			return welcomeOut{Sent: true, Key: job.IdempotencyKey}, nil
		}}); err != nil {
		b.Fatal(err)
	}
	sink := &errSink{}
	b.ReportAllocs()
	b.ResetTimer()
	if err := w.Start(context.Background(), StartOptions{Concurrency: 64, PollInterval: 20 * time.Millisecond,
		OnError: sink.add}); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		<-f.reported
	}
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	if errs := sink.list(); len(errs) > 0 {
		b.Fatal(errs[0])
	}
}
