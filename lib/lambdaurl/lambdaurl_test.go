package lambdaurl

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/httpapi"
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
	requireValidation(t, res.Body, "body")
}

// requireValidation checks that the envelope is an invalid_request whose
// detail.validation names field alone, as every invalid_request does
// (API.md §5; QA: the event's refusal carried an empty detail).
func requireValidation(t *testing.T, body, field string) {
	t.Helper()
	require.JSONEq(t, `"invalid_request"`, mustField(t, body, "code"))
	var detail struct {
		Validation []struct {
			Field string `json:"field"`
		} `json:"validation"`
	}
	require.NoError(t, json.Unmarshal([]byte(mustField(t, body, "detail")), &detail), body)
	require.Len(t, detail.Validation, 1, body)
	require.Equal(t, field, detail.Validation[0].Field, body)
}

// A path with a bad percent escape cannot become a request; it is answered
// in the envelope with a request id, the handler never called (the local
// server's Go HTTP server answers it in plain text: README).
func TestHandlerAnswersABadPathEscapeInTheEnvelope(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler was called") })
	ev := events.LambdaFunctionURLRequest{RawPath: "/api/v1/effects/eff_%ZZ/report", Body: "{}"}
	ev.RequestContext.HTTP.Method = "POST"
	res, err := Handler(h)(context.Background(), ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	requireValidation(t, res.Body, "path")
	require.True(t, ids.Valid(ids.Request, res.Headers["X-Request-Id"]))
}

// mustField answers the error envelope's field name, as JSON.
func mustField(t *testing.T, body, name string) string {
	t.Helper()
	var env struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &env), body)
	v, ok := env.Error[name]
	require.True(t, ok, body)
	return string(v)
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

	// So is the adapter's own refusal of a HEAD it cannot read (its body
	// not base64 as the event says).
	ev = events.LambdaFunctionURLRequest{RawPath: "/api/v1/health", Body: "%%%", IsBase64Encoded: true}
	ev.RequestContext.HTTP.Method = "HEAD"
	res, err = Handler(h)(context.Background(), ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Empty(t, res.Body)
	require.True(t, ids.Valid(ids.Request, res.Headers["X-Request-Id"]))
}

// A path that begins with two slashes is a path, as the local server's Go
// HTTP server reads it (answered 404 there), not a URL whose first segment
// is a host (QA: //evil/api/v1/keys was served as /api/v1/keys, and
// //api/v1/health as /v1/health, behind a Function URL only; a proxy or
// firewall rule in front that matched the path's prefix was passed by).
func TestHandlerReadsADoubleSlashPathAsAPath(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"//evil/api/v1/keys", "//api/v1/health", "///api/v1/health"} {
		var got string
		h := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.URL.Path + " host=" + r.URL.Host })
		ev := events.LambdaFunctionURLRequest{RawPath: raw, RawQueryString: "a=1&a=2"}
		ev.RequestContext.HTTP.Method = "GET"
		res, err := Handler(h)(context.Background(), ev)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, raw)
		require.Equal(t, raw+" host=", got, "the whole raw path is the request's path")
	}
}

// A body that JSON escaping would grow past base64's 4/3 (quotes and
// backslashes take two bytes each in the runtime's JSON) is sent base64:
// an answer within answer.Budget (4 MB) then stays within the Function
// URL's 6 MB response (QA: 4 MB of mostly escaped quotes took 7.9 MB);
// any other is sent as text, as before.
func TestHandlerSendsTheShorterOfTextAndBase64(t *testing.T) {
	t.Parallel()
	for body, base64ed := range map[string]bool{
		`{"data":["plain text, a few \"quotes\"","é"]}`: false,
		`{"key":"` + strings.Repeat(`\"`, 1000) + `"}`:  true,
		strings.Repeat("\u2028", 1000):                  true,
	} {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) })
		ev := events.LambdaFunctionURLRequest{RawPath: "/api/v1/effects"}
		ev.RequestContext.HTTP.Method = "GET"
		res, err := Handler(h)(context.Background(), ev)
		require.NoError(t, err)
		require.Equal(t, base64ed, res.IsBase64Encoded, "%.40s", body)
		got := []byte(res.Body)
		if res.IsBase64Encoded {
			got, err = base64.StdEncoding.DecodeString(res.Body)
			require.NoError(t, err)
		}
		require.Equal(t, body, string(got))
		sent, err := json.Marshal(res)
		require.NoError(t, err)
		require.LessOrEqual(t, len(sent), len(body)*4/3+300, "%.40s", body)
	}
}

// What the event carries reaches the handler as a server would hand it
// over, and what the handler answers reaches the reply: the raw query
// (repeated and encoded parameters as sent, not queryStringParameters'
// one value a name), the cookies as one Cookie header, the decoded body's
// length, the invocation's deadline less the answer's margin; a repeated response header as one
// comma-joined value, and each Set-Cookie as a cookie of its own.
func TestHandlerCarriesTheEventAndTheAnswerWhole(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(time.Minute)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := r.Context().Deadline()
		require.True(t, ok)
		require.Equal(t, deadline.Add(-httpapi.AnswerMargin), got)
		require.Equal(t, []string{"1", "2"}, r.URL.Query()["a"])
		require.Equal(t, "x&y", r.URL.Query().Get("b"))
		require.Equal(t, "s=1; t=2", r.Header.Get("Cookie"))
		require.Equal(t, int64(len("{\"k\":1}")), r.ContentLength)
		w.Header().Add("Vary", "Accept")
		w.Header().Add("Vary", "Authorization")
		w.Header().Add("Set-Cookie", "u=1")
		w.Header().Add("Set-Cookie", "v=2")
		w.WriteHeader(http.StatusAccepted)
	})
	ev := events.LambdaFunctionURLRequest{
		RawPath: "/api/v1/effects", RawQueryString: "a=1&a=2&b=x%26y",
		QueryStringParameters: map[string]string{"a": "1,2", "b": "x&y"},
		Cookies:               []string{"s=1", "t=2"},
		Body:                  base64.StdEncoding.EncodeToString([]byte(`{"k":1}`)), IsBase64Encoded: true,
	}
	ev.RequestContext.HTTP.Method = "POST"
	res, err := Handler(h)(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Equal(t, "Accept, Authorization", res.Headers["Vary"])
	require.Equal(t, []string{"u=1", "v=2"}, res.Cookies)
	require.NotContains(t, res.Headers, "Set-Cookie")
}

// A request ends httpapi.AnswerMargin before its invocation, as every
// route's Timeout ends that long before the functions' own: one that runs
// out of its time is answered in the envelope while the function still
// runs. Bounded by the invocation's own deadline (a function deployed with
// a Timeout under a route's), a route waiting on a lock was cut at the
// instant Lambda stopped the function, and its 503 never sent.
func TestHandlerAnswersBeforeTheInvocationEnds(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var got time.Time
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = r.Context().Deadline()
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	ev := events.LambdaFunctionURLRequest{RawPath: "/api/v1/effects"}
	ev.RequestContext.HTTP.Method = "GET"
	res, err := Handler(h)(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	require.Equal(t, deadline.Add(-httpapi.AnswerMargin), got, "the request's time ends before the invocation's")
	// An invocation without a deadline (a test's, a local run) leaves the
	// request's time to its route.
	got = time.Time{}
	_, err = Handler(h)(context.Background(), ev)
	require.NoError(t, err)
	require.True(t, got.IsZero())
}
