package jobs_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/schematags"
	"github.com/getratchet/ratchet/lib/toolname"
)

// The openapi tags of the worker protocol's requests restate the bounds
// the handlers check, which are these constants: a tag and its constant
// cannot drift apart without this failing.
func TestWorkerOpenAPITagsAreTheHandlersBounds(t *testing.T) {
	t.Parallel()
	rules := func(v any, field string) map[string]string {
		f, ok := reflect.TypeOf(v).FieldByName(field)
		require.True(t, ok, field)
		return schematags.Rules(f)
	}
	require.Equal(t, map[string]string{"min": "1", "max": fmt.Sprint(jobs.MaxClaimLimit),
		"default": fmt.Sprint(jobs.DefaultClaimLimit)}, rules(jobs.ClaimRequest{}, "Limit"))
	require.Equal(t, map[string]string{"min": "0", "max": fmt.Sprint(jobs.MaxClaimWaitSeconds), "default": "0"},
		rules(jobs.ClaimRequest{}, "WaitSeconds"))
	require.Equal(t, map[string]string{"min": fmt.Sprint(jobs.MinRetryAfterMs), "max": fmt.Sprint(jobs.MaxRetryAfterMs)},
		rules(jobs.ReportError{}, "RetryAfterMs"))
	status := map[string]string{"enum": jobs.StatusSucceeded + "|" + jobs.OutcomeFailed}
	require.Equal(t, status, rules(jobs.ReportRequest{}, "Status"))
	require.Equal(t, status, rules(jobs.BatchReportItem{}, "Status"))
	// Contract QA: these bounds were checked but not stated, so a client
	// built from the document learnt them only from a 400.
	require.Equal(t, map[string]string{"required": "", "minItems": "1", "maxItems": fmt.Sprint(jobs.MaxTools)},
		rules(jobs.RegisterRequest{}, "Tools"))
	// A name's and a version's characters are toolname's (contract QA:
	// "send email" passed the schema).
	require.Equal(t, map[string]string{"minLength": "1", "maxLength": fmt.Sprint(toolname.MaxName), "toolname": ""},
		rules(jobs.Tool{}, "Name"))
	require.Equal(t, rules(jobs.Tool{}, "Name"), rules(jobs.EnqueueRequest{}, "Name"))
	version := map[string]string{"minLength": "1", "maxLength": fmt.Sprint(toolname.MaxVersion), "toolname": ""}
	require.Equal(t, version, rules(jobs.Tool{}, "Version"))
	require.Equal(t, version, rules(jobs.ToolTestRequest{}, "Version"))
	require.Equal(t, version, rules(jobs.EnqueueRequest{}, "Version"))
	require.Equal(t, version, rules(jobs.PublishContractRequest{}, "HandlerVersion"))
	require.Equal(t, version, rules(jobs.ReplayRequest{}, "ExpectedHandlerVersion"))
	require.Equal(t, map[string]string{"maxLength": fmt.Sprint(jobs.MaxErrorMessage)}, rules(jobs.ReportError{}, "Message"))
	require.Equal(t, map[string]string{"required": "", "minItems": "1", "maxItems": fmt.Sprint(jobs.MaxBatchReports)},
		rules(jobs.BatchReportRequest{}, "Reports"))
}
