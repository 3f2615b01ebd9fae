package main

// ratio is one comparison reported by the runner: Num / Den from the same
// round. Every figure but the last is a rate, so above 1× means Ratchet (or
// River) did more per second than the reference.
type ratio struct {
	Num, Den string
	Label    string
}

// ratios lists the comparisons of issue 6. The ratchet.* names are the ones
// scripts/benchratchet emits (its gate.go and jobs.go hooks); a ratio whose
// figures are missing is listed as waiting rather than guessed.
var ratios = []ratio{
	// Ratchet against River, the queue users would otherwise pick.
	{"ratchet.jobs.work_jobs_per_s", "river.work_jobs_per_s", "Work, pre-queued jobs: Ratchet vs River"},
	{"ratchet.jobs.enqueue_per_s", "river.insert_jobs_per_s", "Single enqueue at 16 clients: Ratchet vs River"},
	{"ratchet.jobs.insert_and_work_jobs_per_s", "river.insert_and_work_jobs_per_s", "Insert and work at once: Ratchet vs River"},
	// Ratchet against what Postgres itself does for the unavoidable writes.
	{"ratchet.gate.cycles_per_s", "pgbench.insert_tps", "Gate begin→report cycle vs single-row INSERT"},
	{"ratchet.jobs.enqueue_per_s", "pgbench.insert_tps", "Single enqueue vs single-row INSERT"},
	{"ratchet.jobs.work_jobs_per_s", "pgbench.claim_complete_tps", "Work vs one-job claim+complete transaction"},
	{"ratchet.jobs.work_jobs_per_s", "pgbench.claim_batch100_jobs_per_s", "Work vs 100-job batched claim+complete"},
	// River against the same limits, to calibrate the run against issue 6's
	// measurements (River ≈ 0.28× INSERT tps and ≈ 0.27× the batched claim).
	{"river.insert_jobs_per_s", "pgbench.insert_tps", "River insert vs single-row INSERT"},
	{"river.work_jobs_per_s", "pgbench.claim_batch100_jobs_per_s", "River work vs 100-job batched claim+complete"},
	// Ratchet against itself: the one latency ratio (lower is better; issue
	// 6's target is ≤ 1.2×, a claim that does not slow down with depth).
	{"ratchet.jobs.claim_p50_ms_1m", "ratchet.jobs.claim_p50_ms_10k", "Claim latency p50, 1 M vs 10 k queued (lower is better)"},
}
