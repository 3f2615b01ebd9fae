package httpapi_test

// Conformance probes against the wire contract (API.md §0 and §5): routes,
// statuses, envelopes, field sets and error details. Each row states one
// binding sentence of the contract, so a regression names what it broke.

import (
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
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

// contractRoutes is every route API.md names (ids well-formed but unknown).
var contractRoutes = [][2]string{
	{"POST", "/api/v1/keys"}, {"GET", "/api/v1/keys"}, {"DELETE", "/api/v1/keys/key_01m8mgjegc1c0fpgzc2q7nz2v8"},
	{"POST", "/api/v1/effects/begin"}, {"GET", "/api/v1/effects"},
	{"GET", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e"},
	{"POST", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e/report"},
	{"POST", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e/heartbeat"},
	{"POST", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e/resolve"},
	{"GET", "/api/v1/policies"}, {"GET", "/api/v1/policies/email.send"}, {"PUT", "/api/v1/policies/email.send"},
	{"GET", "/api/v1/approvals"}, {"POST", "/api/v1/approvals/apr_01m8mgjehqh9k8t28cny8gz3xh/approve"},
	{"POST", "/api/v1/approvals/apr_01m8mgjehqh9k8t28cny8gz3xh/reject"},
	{"GET", "/api/v1/circuits"}, {"POST", "/api/v1/circuits/email.send/open"},
	{"POST", "/api/v1/circuits/email.send/close"}, {"POST", "/api/v1/circuits/stop"}, {"POST", "/api/v1/circuits/release"},
	{"POST", "/api/v1/groups"}, {"GET", "/api/v1/groups/grp_01m8mgjej72fgqnmkj8dw87agp"},
	{"POST", "/api/v1/groups/grp_01m8mgjej72fgqnmkj8dw87agp/commit"},
	{"POST", "/api/v1/groups/grp_01m8mgjej72fgqnmkj8dw87agp/unwind"},
	{"POST", "/api/v1/reconcile"}, {"POST", "/api/v1/webhooks"},
	{"GET", "/api/v1/webhooks/whk_01m8kjtk8gsrfzr7mt4ax3c1gx/deliveries"},
	{"POST", "/api/v1/runs"}, {"GET", "/api/v1/runs/run_01m8mgjejemp8r6x8drx0e13jw"},
	{"POST", "/api/v1/runs/run_01m8mgjejemp8r6x8drx0e13jw/steps"},
	{"POST", "/api/v1/runs/run_01m8mgjejemp8r6x8drx0e13jw/finish"},
	{"POST", "/api/v1/steps/stp_01m8mgjejf3v6d1k607me40emv/cancel"},
	{"POST", "/api/v1/workers/register"}, {"POST", "/api/v1/workers/wkr_01m8mgjek0ze8ys743sv5h6qz5/claim"},
	{"POST", "/api/v1/jobs/job_01m8mgjejfew3b48vmdmgwjm45/heartbeat"},
	{"POST", "/api/v1/jobs/job_01m8mgjejfew3b48vmdmgwjm45/report"},
	{"GET", "/api/v1/endpoints"}, {"POST", "/api/v1/endpoints"},
	{"GET", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/policy"},
	{"PUT", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/policy"},
	{"POST", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/pause"},
	{"POST", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/resume"},
	{"POST", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/circuit/close"},
	{"POST", "/api/v1/tools/send_email/contracts"}, {"GET", "/api/v1/tools/send_email/contracts"},
	{"POST", "/api/v1/tools/send_email/test"},
	{"GET", "/api/v1/steps/stp_01m8mgjejf3v6d1k607me40emv/replay"},
	{"POST", "/api/v1/steps/stp_01m8mgjejf3v6d1k607me40emv/replay"},
	{"GET", "/api/v1/queue/health"},
}

// TestConformanceRoutesExist: every route of API.md exists under /api/v1 and
// the /v1 alias (an authenticated route answers 401 without a key, never
// 404/405), and every response carries X-Request-Id.
func TestConformanceRoutesExist(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, r := range contractRoutes {
		for _, path := range []string{r[1], strings.TrimPrefix(r[1], "/api")} {
			res := env.Do(r[0], path, "", nil)
			require.Equal(t, http.StatusUnauthorized, res.Status, "%s %s: %s", r[0], path, res.Body)
			require.Equal(t, apierr.CodeUnauthorized, res.ErrorCode(), "%s %s", r[0], path)
			require.NotEmpty(t, res.Header.Get("X-Request-Id"), "%s %s", r[0], path)
		}
	}
	for _, path := range []string{"/api/v1/health", "/v1/health", "/api/v1/openapi.json", "/llms.txt",
		"/.well-known/ratchet.json"} {
		res := env.Must(http.StatusOK, "GET", path, "", nil)
		require.NotEmpty(t, res.Header.Get("X-Request-Id"), path)
	}
	for _, c := range []struct{ method, path, key string }{
		{"GET", "/api/v1/nope", ""}, {"GET", "/api/cron/sweep", ""}, {"POST", "/api/cron/sweep", "wrong"},
	} {
		res := env.Do(c.method, c.path, c.key, nil)
		want := http.StatusUnauthorized
		if c.path == "/api/v1/nope" {
			want = http.StatusNotFound
		}
		require.Equal(t, want, res.Status, "%s %s: %s", c.method, c.path, res.Body)
		require.NotEmpty(t, res.ErrorCode())
		require.NotEmpty(t, res.Header.Get("X-Request-Id"))
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	env.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).Decode(t, &doc)
	for _, r := range contractRoutes {
		require.Contains(t, doc.Paths[openAPIPath(r[1])], strings.ToLower(r[0]), "%s %s in openapi", r[0], r[1])
	}
}

// openAPIPath turns a concrete contract path back into its pattern.
func openAPIPath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		if prefix, _, ok := strings.Cut(s, "_"); ok && len(s) == len(prefix)+27 {
			switch {
			case i == 4 && parts[3] == "workers":
				parts[i] = "{workerId}"
			default:
				parts[i] = "{id}"
			}
		}
	}
	out := strings.Join(parts, "/")
	out = strings.Replace(out, "/policies/email.send", "/policies/{type}", 1)
	out = strings.Replace(out, "/circuits/email.send/", "/circuits/{effect_type}/", 1)
	return strings.Replace(out, "/tools/send_email/", "/tools/{name}/", 1)
}
