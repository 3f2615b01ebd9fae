package apitest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// The check finds what disagrees with the document, and only that.
func TestOpenAPICheckFindsDisagreements(t *testing.T) {
	t.Parallel()
	c, err := loadChecker()
	require.NoError(t, err)
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	get := httptest.NewRequest("GET", "/api/v1/effects/eff_01m8kjt9g002extbwvcndh4bkd", nil)

	require.Contains(t, c.check(get, http.StatusTeapot, jsonHeader, []byte(`{}`)),
		"answered 418, which the OpenAPI document does not list")
	require.Contains(t, c.check(get, http.StatusOK, jsonHeader, []byte(`{"id":5}`)),
		"does not match the OpenAPI document")
	require.Contains(t, c.check(get, http.StatusNotFound, jsonHeader, []byte(`{"error":{"code":1}}`)),
		"does not match the OpenAPI document")
	require.Empty(t, c.check(get, http.StatusNotFound, jsonHeader,
		[]byte(`{"error":{"code":"not_found","message":"No such effect in this workspace.","detail":{}}}`)))
	// An error's code must be one the route lists for its status: its
	// own (not_found here) and those any authenticated route may answer.
	require.Empty(t, c.check(get, http.StatusUnauthorized, jsonHeader,
		[]byte(`{"error":{"code":"unauthorized","message":"No key.","detail":{}}}`)))
	require.Contains(t, c.check(get, http.StatusNotFound, jsonHeader,
		[]byte(`{"error":{"code":"method_not_allowed","message":"No.","detail":{}}}`)),
		"answered 404 method_not_allowed, which the OpenAPI document does not list for it")
	require.Contains(t, c.check(get, http.StatusConflict, jsonHeader,
		[]byte(`{"error":{"code":"invalid_state","message":"No.","detail":{}}}`)),
		"answered 409, which the OpenAPI document does not list")
	// The legacy alias is checked as the route it serves.
	require.Contains(t, c.check(httptest.NewRequest("GET", "/v1/effects/eff_01m8kjt9g002extbwvcndh4bkd", nil),
		http.StatusConflict, jsonHeader, []byte(`{}`)), "GET /api/v1/effects/{id} answered 409")
	// Every timestamp is RFC 3339 in UTC (API.md §0).
	effect := func(at string) []byte {
		return []byte(`{"id":"eff_01m8kjt9g002extbwvcndh4bkd","effect_type":"a.b","idempotency_key":"k","state":"leased",` +
			`"attempt":0,"attempts":[],"result":null,"result_preview":null,"payload_preview":null,"cost_micros":null,` +
			`"run_id":null,"group_id":null,"compensates_effect_id":null,"denial_code":null,"approval_id":null,` +
			`"lease_expires_at":null,"created_at":"` + at + `","updated_at":"2026-11-29T12:00:00Z","result_unreadable":false}`)
	}
	require.Empty(t, c.check(get, http.StatusOK, jsonHeader, effect("2026-11-29T12:00:00.123456Z")))
	require.Contains(t, c.check(get, http.StatusOK, jsonHeader, effect("2026-11-29T13:00:00+01:00")), "is not in UTC")
	require.Contains(t, c.check(get, http.StatusOK, jsonHeader, effect("2026-11-29 12:00:00")), "is not an RFC 3339 time")
	// Not a route: not checked here.
	require.Empty(t, c.check(httptest.NewRequest("GET", "/api/v1/nowhere", nil), http.StatusNotFound, jsonHeader, []byte(`1`)))
}
