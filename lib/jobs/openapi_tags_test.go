package jobs_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/schematags"
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
}
