package httpapi_test

// Conformance probes against the wire contract (API.md §0 and §5): routes,
// statuses, envelopes, field sets and error details. Each row states one
// binding sentence of the contract, so a regression names what it broke.

import (
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
)

// TestConformanceDecodePaths: detail.validation[].field is the dotted path
// from the body root, for unknown and mistyped fields alike, nested included.
func TestConformanceDecodePaths(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dst        any
		body, want string
	}{
		{&jobs.ReportRequest{}, `{"error":{"message":"x","bogus":1}}`, "error.bogus"},
		{&jobs.ReportRequest{}, `{"error":{"retryAfterMs":"soon"}}`, "error.retryAfterMs"},
		{&jobs.ReportRequest{}, `{"bogus":1}`, "bogus"},
		{&jobs.PublishContractRequest{}, `{"retryPolicy":{"maxAttempts":"x"}}`, "retryPolicy.maxAttempts"},
		{&jobs.PublishContractRequest{}, `{"retryPolicy":{"maxAttempts":3,"zzz":1}}`, "retryPolicy.zzz"},
		{&jobs.RegisterRequest{}, `{"tools":[{"name":"a","version":"1"},{"name":"b","version":"1","x":2}]}`, "tools.1.x"},
		{&jobs.BatchReportRequest{}, `{"reports":[{"jobId":"j","leaseToken":"t","error":{"nope":1}}]}`, "reports.0.error.nope"},
		{&gate.PutPolicyRequest{}, `{"lease_seconds":"x"}`, "lease_seconds"},
		{&gate.BeginRequest{}, `{"compensation":{"effect_type":"a","zz":1}}`, "compensation.zz"},
		{&gate.BeginRequest{}, `{"compensation":{"effect_type":1}}`, "compensation.effect_type"},
		{&jobs.RegisterRequest{}, `{"tools":[{"name":"a","version":"1"},{"name":2,"version":"1"}]}`, "tools.1.name"},
		{&jobs.RegisterRequest{}, `{"tools":"send@1"}`, "tools"},
		{&gate.PutPolicyRequest{}, `{"required_dimensions":["a",1]}`, "required_dimensions.1"},
		{&jobs.ReportRequest{}, `{"error":{"retryAfterMs":1.5}}`, "error.retryAfterMs"},
		{&gate.BeginRequest{}, `{"payload":{"anything":{"goes":1}},"bogus":true}`, "bogus"},
	} {
		err := httpapi.DecodeJSON([]byte(c.body), c.dst)
		var ae *apierr.Error
		require.ErrorAs(t, err, &ae, c.body)
		require.Equal(t, apierr.CodeInvalidRequest, ae.Code, c.body)
		require.Equal(t, []apierr.FieldError{{Field: c.want, Message: ae.Detail["validation"].([]apierr.FieldError)[0].Message}},
			ae.Detail["validation"], c.body)
	}
}

func keysOf(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var _ = http.StatusOK
