package main

import "context"

// Durable-job and SDK figures (issue 6, item 1). TODO(lead, after the jobs
// and SDK merges): replace each b.todo with the measurement; keep the emitted
// names, scripts/bench's ratio table (scripts/benchrun/ratios.go) compares
// them with River's and pgbench's figures from the same round:
//
//	ratchet.jobs.enqueue_per_s              vs river.insert_jobs_per_s, pgbench.insert_tps
//	ratchet.jobs.work_jobs_per_s            vs river.work_jobs_per_s, pgbench.claim_complete_tps
//	ratchet.jobs.insert_and_work_jobs_per_s vs river.insert_and_work_jobs_per_s
//
// To stay comparable with bench/river and scripts/bench-pgbench: seed
// b.scale.History completed jobs (and their runs/steps) straight into the
// tables with one INSERT … SELECT generate_series, then ANALYZE, before each
// figure; time wall-clock over the whole batch (first request → last job
// recorded SUCCEEDED in the database), never a trimmed window; and check
// afterwards that exactly the expected jobs are SUCCEEDED.
//
// Tools that arrive with the merges: the jobs branch's lib/jobs
// Service.CloneQueued (bulk-loads a deep queue from one real job, as its
// scripts/jobsbench does for 10 k / 1 M claim latency) and, for the history,
// cloneRows/analyze in seed.go (see gate.go for the pattern: real rows made
// over HTTP, then cloned). The Go SDK is its own module (sdk/go); the SDK
// branch adds it to the main go.mod with a replace directive, after which
// this package can import it. Count claim calls at the server (wrap
// in.App.Server in a counting http.Handler) rather than trusting the SDK.

// jobsEnqueue: POST /api/v1/runs/{id}/steps, one job per request, from
// b.scale.Clients clients, b.scale.InsertJobs (or Requests) jobs.
func jobsEnqueue(ctx context.Context, b *bench) error {
	b.todo("ratchet.jobs.enqueue_per_s", "jobs not merged yet")
	return nil
}

// jobsWork: b.scale.Jobs pre-queued jobs (enqueue not timed) drained by the
// Go SDK worker at concurrency b.scale.Workers against one instance.
func jobsWork(ctx context.Context, b *bench) error {
	b.todo("ratchet.jobs.work_jobs_per_s", "jobs/SDK not merged yet")
	return nil
}

// jobsInsertAndWork: b.scale.Clients clients enqueue b.scale.InsertJobs jobs
// while the SDK worker (b.scale.Workers) works them; timed until the last is
// SUCCEEDED.
func jobsInsertAndWork(ctx context.Context, b *bench) error {
	b.todo("ratchet.jobs.insert_and_work_jobs_per_s", "jobs/SDK not merged yet")
	return nil
}

// jobsClaimLatency: p50 of one claim (limit 1) with each of b.scale.ClaimQueued
// jobs queued (10 k and 1 M at full scale; seed them with INSERT … SELECT
// generate_series and ANALYZE). Emit ratchet.jobs.claim_p50_ms_<n> with n
// as 10k / 1m (e.g. ratchet.jobs.claim_p50_ms_10k).
func jobsClaimLatency(ctx context.Context, b *bench) error {
	b.todo("ratchet.jobs.claim_p50_ms_10k", "jobs not merged yet (also ratchet.jobs.claim_p50_ms_1m)")
	return nil
}

// jobsEndToEnd: enqueue → handler start latency with an idle SDK worker
// waiting (long-poll claim), p50 and p99.
func jobsEndToEnd(ctx context.Context, b *bench) error {
	b.todo("ratchet.jobs.e2e_p50_ms", "jobs/SDK not merged yet (also ratchet.jobs.e2e_p99_ms)")
	return nil
}

// idleClaims: claim calls an idle SDK worker makes in b.scale.IdleWindow
// (10 min) at default settings. Count requests at the server (wrap
// in.App.Server in a counting http.Handler) rather than trusting the SDK; a
// 10-minute wall-clock wait does not fit the default run, so derive it from a
// shorter window only if the SDK's poll schedule is fixed (long-poll
// waitSeconds), and say so in the comment line.
func idleClaims(ctx context.Context, b *bench) error {
	b.todo("ratchet.serverless.idle_claims_10min", "SDK not merged yet")
	return nil
}
