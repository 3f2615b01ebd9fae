package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// A batch report rewrites its executions on the pages they were inserted on
// (HOT updates: no index entry is written again), because job_executions
// keeps room for them there (migration 0045): on full pages nearly every
// report moved its execution to another page and wrote all of its index
// entries again (benchmark run R). Not parallel: other tests' rows would
// share the pages.
func TestABatchReportRewritesItsExecutionsInPlace(t *testing.T) {
	b := setup(t)
	const n = 60
	b.enqueueJobs(t, b.run(t), n)
	claimed := b.claim(t, b.register(t), n)
	require.Len(t, claimed, n)
	ids := make([]string, n)
	reports := make([]jobs.BatchReportItem, n)
	for i, j := range claimed {
		ids[i] = j.JobID
		reports[i] = jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: "SUCCEEDED"}
	}
	pages := func() map[string]int64 {
		rows, err := b.env.App.Pool.Query(ctx,
			`SELECT job_id, (ctid::text::point)[0]::bigint FROM job_executions WHERE job_id = ANY($1)`, ids)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var id string
			var page int64
			require.NoError(t, rows.Scan(&id, &page))
			out[id] = page
		}
		require.NoError(t, rows.Err())
		require.Len(t, out, n)
		return out
	}
	before := pages()

	res, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: reports})
	require.NoError(t, err)
	for _, r := range res.Results {
		require.Nil(t, r.Error)
	}
	moved := 0
	for id, page := range pages() {
		if before[id] != page {
			moved++
		}
	}
	// A page's last few rows may find the room taken by its first ones'
	// (9 of 60 here); on full pages all 60 moved.
	require.LessOrEqual(t, moved, n/3, "the reports moved %d of %d executions to other pages", moved, n)
}
