package lambdaurl

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/ids"
)

func TestHandlerRoundTrip(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		require.Equal(t, "/api/v1/effects/begin", r.URL.Path)
		require.Equal(t, "a=1", r.URL.RawQuery)
		require.Equal(t, "Bearer x", r.Header.Get("Authorization"))
		w.Header().Set("X-Request-Id", "req_1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(append([]byte("echo:"), body...))
	})
	ev := events.LambdaFunctionURLRequest{
		RawPath: "/api/v1/effects/begin", RawQueryString: "a=1",
		Headers:         map[string]string{"authorization": "Bearer x"},
		Body:            base64.StdEncoding.EncodeToString([]byte(`{"k":1}`)),
		IsBase64Encoded: true,
	}
	ev.RequestContext.HTTP.Method = "POST"
	res, err := Handler(h)(context.Background(), ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Equal(t, `echo:{"k":1}`, res.Body)
	require.Equal(t, "req_1", res.Headers["X-Request-Id"])
}

func TestHandlerRejectsBadBase64(t *testing.T) {
	t.Parallel()
	ev := events.LambdaFunctionURLRequest{RawPath: "/", Body: "%%%", IsBase64Encoded: true}
	ev.RequestContext.HTTP.Method = "POST"
	res, err := Handler(http.NotFoundHandler())(context.Background(), ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.True(t, ids.Valid(ids.Request, res.Headers["X-Request-Id"]), "every response carries a request id")
}

// A HEAD answer has no body, as a server would send it.
func TestHandlerHeadHasNoBody(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	ev := events.LambdaFunctionURLRequest{RawPath: "/api/v1/health"}
	ev.RequestContext.HTTP.Method = "HEAD"
	res, err := Handler(h)(context.Background(), ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Empty(t, res.Body)
	require.Equal(t, "application/json", res.Headers["Content-Type"])
}
