package httpapi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/lambdaurl"
)

// A start that failed because the database was out of reach answers 503
// database_unavailable (the next request builds again); a configuration
// error answers 500. Both carry a request id and the envelope, on Vercel
// and through a Lambda Function URL alike.
func TestStartFailedAnswers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("migrate: connect: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}),
			http.StatusServiceUnavailable, "database_unavailable"},
		{errors.New("config: KEY_HASH_SECRET is required but not set"), http.StatusInternalServerError, "internal_error"},
	} {
		rec := httptest.NewRecorder()
		httpapi.StartFailed(c.err).ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/effects", nil))
		require.Equal(t, c.status, rec.Code)
		require.NotEmpty(t, rec.Header().Get("X-Request-Id"))
		var body map[string]map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
		require.Equal(t, c.code, body["error"]["code"])
		require.Equal(t, rec.Header().Get("X-Request-Id"), body["error"]["detail"].(map[string]any)["request_id"],
			"a 5xx carries its request id, as the router's do")

		res, err := lambdaurl.Handler(httpapi.StartFailed(c.err))(t.Context(), events.LambdaFunctionURLRequest{
			RawPath: "/api/v1/effects", RequestContext: events.LambdaFunctionURLRequestContext{
				HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "GET"}}})
		require.NoError(t, err)
		require.Equal(t, c.status, res.StatusCode)
		require.NoError(t, json.Unmarshal([]byte(res.Body), &body), res.Body)
		require.Equal(t, c.code, body["error"]["code"])
	}
}
