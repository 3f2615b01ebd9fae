package jobs_test

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
)

// The replay preview checks the saved input against its targets' input
// schemas only: its reads of the targets leave their output schemas (up to
// 256 KiB each, a hundred targets a page) in the database (review: both
// read every target's output schema and dropped it).
func TestTheReplayPreviewDoesNotReadOutputSchemas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out := `{"type":"object","description":"` + strings.Repeat("o", 100) + `"}`
	for _, v := range []string{"1", "2"} {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: v, InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: json.RawMessage(out)})
		require.NoError(t, err)
	}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"targets": {jobs.SQLReplayTargets, []any{b.ws, "send_email", 100, nil, jobs.MaxCheckEvaluations,
			jobs.CompileBaseEvaluations, jobs.CompileBytesPerEvaluation, jobs.ReplaySchemaBatchBytes}},
		"older": {jobs.SQLReplayOlderTargets, []any{b.ws, "send_email", 3, 100, jobs.MaxCheckEvaluations,
			jobs.CompileBaseEvaluations, jobs.CompileBytesPerEvaluation}},
	} {
		rows, err := b.env.App.Pool.Query(ctx, q.sql, q.args...)
		require.NoError(t, err, name)
		read, err := pgx.CollectRows(rows, pgx.RowToMap)
		require.NoError(t, err, name)
		for _, r := range read {
			require.NotNil(t, r["input_schema"], "%s: the input schema is read", name)
			require.True(t, r["output_schema"] == nil, "%s: the output schema is not read", name)
		}
		n := len(read)
		require.Equal(t, 2, n, name)
	}
}

// costlyOutputs publishes a contract of send_email@1 whose outputSchema
// counts 4 991 evaluations for each item of an array output (its anyOf's
// first branch accepts every item, so the check itself is quick), and
// answers the jobs claimed under it, and an output of n items.
func costlyOutputs(t *testing.T, b *bundle, jobs_ int) ([]jobs.ClaimedJob, func(n int) json.RawMessage) {
	t.Helper()
	branches := []string{"{}"}
	for i := 1; i < 4_990; i++ {
		branches = append(branches, `{"type":"string","minLength":`+strconv.Itoa(i)+`}`)
	}
	_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
		HandlerVersion: "1", InputSchema: json.RawMessage(`{}`),
		OutputSchema: json.RawMessage(`{"type":"array","items":{"anyOf":[` + strings.Join(branches, ",") + `]}}`)})
	require.NoError(t, err)
	runID := b.run(t)
	for i := range jobs_ {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
	}
	claimed := b.claim(t, b.register(t), jobs_)
	require.Len(t, claimed, jobs_)
	return claimed, func(n int) json.RawMessage {
		return json.RawMessage("[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]")
	}
}

// A batch's successes are checked against their contracts from one budget,
// what one report's check may take, not one each: a batch of 100 could
// otherwise check for 100 times as long, holding its jobs' locks (review:
// half an hour). A batch the budget cannot cover is refused whole, nothing
// recorded, and every worker SDK sends it again report by report, each
// checked from the whole budget; a batch it covers is recorded as before.
func TestABatchsOutputsAreCheckedFromOneBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claimed, output := costlyOutputs(t, b, 5)
	// 160 items: about 800 000 evaluations, more than half the budget.
	item := func(j jobs.ClaimedJob, status string, out json.RawMessage) jobs.BatchReportItem {
		return jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: status, Output: out}
	}
	_, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
		item(claimed[0], "SUCCEEDED", output(160)), item(claimed[1], "FAILED", nil),
		item(claimed[2], "SUCCEEDED", output(160))}})
	require.Equal(t, apierr.CodeInvalidRequest, code(t, err))
	e, _ := apierr.As(err)
	v := e.Detail["validation"].([]apierr.FieldError)
	require.Equal(t, "reports", v[0].Field)
	require.Contains(t, v[0].Message, "one by one")
	for _, j := range claimed[:3] {
		require.Equal(t, "RUNNING", b.step(t, j.StepID).Status, "nothing was recorded")
	}

	// Alone, each is checked and recorded.
	for _, i := range []int{0, 2} {
		res, err := b.svc.Report(ctx, b.worker, claimed[i].JobID, jobs.ReportRequest{LeaseToken: claimed[i].LeaseToken,
			Status: "SUCCEEDED", Output: output(160)})
		require.NoError(t, err)
		require.Equal(t, "SUCCEEDED", res.Status)
	}

	// Two of 100 items (about 500 000 each) fit the budget together.
	res, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
		item(claimed[3], "SUCCEEDED", output(100)), item(claimed[4], "SUCCEEDED", output(100))}})
	require.NoError(t, err)
	for _, r := range res.Results {
		require.Nil(t, r.Error)
		require.Equal(t, "SUCCEEDED", r.Status)
	}
}

// A page of contracts reads those it can hold within its answer, and the
// one after (which says a next page follows), not its whole limit (review:
// up to 201 contracts of two 256 KiB schemas each were read for a page cut
// at 4 MB). The page, cursor and all, is the one the whole limit makes.
func TestAContractPageReadsWhatItsAnswerCanHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	schema := func(c byte) json.RawMessage {
		return json.RawMessage(`{"description": "` + strings.Repeat(string(c), 50_000) + `"}`)
	}
	for i := range 12 {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: "1", InputSchema: schema('a' + byte(i)), OutputSchema: schema('A' + byte(i))})
		require.NoError(t, err)
	}
	cursor := func(c jobs.Contract) string { return strconv.Itoa(c.ContractVersion) }
	all, err := b.svc.ListContracts(ctx, b.ws, "send_email", "", 201)
	require.NoError(t, err)
	require.Len(t, all, 12, "1.2 MB of schemas fit a whole answer")
	for _, within := range []int{1, 100_000, 250_000, 350_000, 1_000_000} {
		narrow := answer.Within(ctx, within)
		read, err := b.svc.ListContracts(narrow, b.ws, "send_email", "", 201)
		require.NoError(t, err)
		want, err := httpapi.NewCamelPage(narrow, all, 200, cursor)
		require.NoError(t, err)
		got, err := httpapi.NewCamelPage(narrow, read, 200, cursor)
		require.NoError(t, err)
		require.True(t, reflect.DeepEqual(want, got), "within %d: the page is the same", within)
		var page struct{ Data []json.RawMessage }
		require.NoError(t, json.Unmarshal(mustJSON(t, want), &page))
		// What the page keeps, the contract after (a next page follows),
		// and at most one more, whose predecessors' schemas alone fit.
		require.Less(t, len(page.Data), 12, "within %d: the page was cut", within)
		require.LessOrEqual(t, len(read), max(2, len(page.Data)+2), "within %d: read %d for a page of %d",
			within, len(read), len(page.Data))
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// The preview's read of the contracts older than its list holds only the
// input schemas its budget left may reach (each costs, compiled, at least
// jobs.CompileBaseEvaluations and one more per
// jobs.CompileBytesPerEvaluation bytes), and the first it cannot reach
// without its schema, which says one more follows (review: a page of 100
// schemas of up to 256 KiB each was read when the budget could reach
// none).
func TestTheReplayPreviewReadsTheOlderSchemasItsBudgetReaches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Each costs at least 20 + 40 = 60 to compile.
	schema := `{"description":"` + strings.Repeat("d", 40*jobs.CompileBytesPerEvaluation) + `"}`
	for range 5 {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: "2", InputSchema: json.RawMessage(schema)})
		require.NoError(t, err)
	}
	read := func(budget int64) (schemas, without int) {
		t.Helper()
		rows, err := b.env.App.Pool.Query(ctx, jobs.SQLReplayOlderTargets, b.ws, "send_email", 6, 100, budget,
			jobs.CompileBaseEvaluations, jobs.CompileBytesPerEvaluation)
		require.NoError(t, err)
		read, err := pgx.CollectRows(rows, pgx.RowToMap)
		require.NoError(t, err)
		for i, r := range read {
			require.EqualValues(t, 5-i, r["contract_version"], "newest first")
			if r["input_schema"] == nil {
				without++
			} else {
				schemas++
			}
		}
		return schemas, without
	}
	for _, c := range []struct {
		budget           int64
		schemas, without int
	}{
		{jobs.MaxCheckEvaluations, 5, 0},
		{5*60 + 1, 5, 0},
		{5 * 60, 4, 1},
		{2*60 + 1, 2, 1},
		{61, 1, 1},
		{60, 0, 1},
		{1, 0, 1},
		{0, 0, 1},
		{-1_000, 0, 1},
	} {
		schemas, without := read(c.budget)
		require.Equal(t, []int{c.schemas, c.without}, []int{schemas, without}, "budget %d", c.budget)
	}
}
