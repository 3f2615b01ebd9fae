package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

// A bounded integer field of the jobs routes is told one rule, "must be an
// integer from A to B", whether the decoder refuses a number that is no
// integer (1.5: the field's openapi min/max tags) or the handler an integer
// out of its bounds (jobs QA: the handlers said "(milliseconds)", "null
// or", "(additional executions)", or "from 1" with no upper bound).
func TestABoundedIntegerFieldIsToldOneRuleByTheDecoderAndTheHandler(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	op := e.ws.Key
	runID := e.run()
	ep := e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", op, map[string]any{"name": "billing"}).JSON()
	replayPath := "/api/v1/steps/" + e.enqueue(runID, map[string]any{"name": "send_email", "version": "1"})["stepId"].(string) +
		"/replay"
	policyPath := "/api/v1/endpoints/" + ep["id"].(string) + "/policy"
	nested := func(field string, v any) map[string]any {
		parent, leaf, ok := strings.Cut(field, ".")
		if !ok {
			return map[string]any{field: v}
		}
		return map[string]any{parent: map[string]any{leaf: v}}
	}
	for _, c := range []struct {
		method, path, key string
		base              map[string]any
		field             string
		lo, hi            int64 // hi 0: bounded by its type alone, the handler refusing below lo
	}{
		{"POST", "/api/v1/runs/" + runID + "/steps", e.ingest, map[string]any{"name": "send_email", "version": "1"}, "timeoutMs", 1000, 86400000},
		{"POST", "/api/v1/runs/" + runID + "/steps", e.ingest, map[string]any{"name": "send_email", "version": "1"}, "maxAttempts", 1, 10},
		{"POST", "/api/v1/runs/" + runID + "/steps", e.ingest, map[string]any{"name": "send_email", "version": "1"}, "contractVersion", 1, 0},
		{"POST", "/api/v1/runs/" + runID + "/steps", e.ingest, map[string]any{"name": "send_email", "version": "1"}, "delayMs", 0, 2592000000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"], "preset": "CUSTOM"}, "maxAttempts", 1, 10},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"], "preset": "CUSTOM"}, "initialDelayMs", 1, 86400000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"], "preset": "CUSTOM"}, "maxDelayMs", 1, 86400000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"]}, "defaultTimeoutMs", 1000, 86400000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"]}, "circuitCooldownMs", 1000, 86400000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"]}, "maxConcurrent", 1, 1000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"]}, "rateLimitPerMinute", 1, 100000},
		{"PUT", policyPath, op, map[string]any{"expectedVersion": ep["version"]}, "circuitFailureThreshold", 1, 1000},
		{"POST", "/api/v1/tools/send_email/contracts", op, map[string]any{"handlerVersion": "1"}, "timeoutMs", 1000, 86400000},
		{"POST", "/api/v1/tools/send_email/contracts", op, map[string]any{"handlerVersion": "1", "retryPreset": "CUSTOM"}, "retryPolicy.maxAttempts", 1, 10},
		{"POST", "/api/v1/tools/send_email/contracts", op, map[string]any{"handlerVersion": "1", "retryPreset": "CUSTOM"}, "retryPolicy.initialDelayMs", 1, 86400000},
		{"POST", replayPath, op, map[string]any{"acknowledgeDuplicateRisk": true}, "maxAttempts", 1, 10},
		{"POST", replayPath, op, map[string]any{"acknowledgeDuplicateRisk": true,
			"expectedHandlerVersion": "1", "acknowledgeVersionChange": true}, "targetContractVersion", 1, 0},
		{"POST", replayPath, op, map[string]any{"acknowledgeDuplicateRisk": true}, "expectedAttempt", 0, 0},
		{"PUT", policyPath, op, map[string]any{}, "expectedVersion", 0, 0},
	} {
		name := c.method + " " + c.path + " " + c.field
		values, rule := []any{1.5, c.lo - 1, c.hi + 1}, apierr.IntegerRule(c.lo, c.hi)
		if c.hi == 0 {
			values, rule = []any{1.5, c.lo - 1}, apierr.IntegerRule(c.lo, "2^63-1")
		}
		for _, v := range values {
			body := nested(c.field, v)
			for k, bv := range c.base {
				if _, ok := body[k]; !ok {
					body[k] = bv
				}
			}
			res := e.Do(c.method, c.path, c.key, body)
			require.Equal(t, http.StatusBadRequest, res.Status, "%s %v: %s", name, v, res.Body)
			var out struct {
				Error struct {
					Detail struct {
						Validation []apierr.FieldError `json:"validation"`
					} `json:"detail"`
				} `json:"error"`
			}
			res.Decode(t, &out)
			require.Contains(t, out.Error.Detail.Validation,
				apierr.FieldError{Field: c.field, Message: rule}, "%s %v", name, v)
		}
	}
}
