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
	// Not a route: not checked here.
	require.Empty(t, c.check(httptest.NewRequest("GET", "/api/v1/nowhere", nil), http.StatusNotFound, jsonHeader, []byte(`1`)))
}
