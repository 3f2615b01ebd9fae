package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/httpapi"
)

func TestUnknownRouteIsNotFoundEnvelope(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	r := env.Must(http.StatusNotFound, "GET", "/api/v1/nope", "", nil)
	require.Equal(t, "not_found", r.ErrorCode())
	require.NotEmpty(t, r.Header.Get("X-Request-Id"))
	detail := r.JSON()["error"].(map[string]any)["detail"]
	require.NotNil(t, detail, "detail is always an object")
}

func TestWrongMethodIsUnknownRouteWithAllow(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	r := env.Must(http.StatusNotFound, "PUT", "/api/v1/workspaces", "", nil)
	require.Equal(t, "not_found", r.ErrorCode())
	require.Equal(t, "POST", r.Header.Get("Allow"))
}

func TestV1AliasServesSameRoutes(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	a := env.Must(http.StatusOK, "GET", "/v1/keys", ws.Key, nil)
	b := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil)
	require.JSONEq(t, string(b.Body), string(a.Body))
	env.Must(http.StatusCreated, "POST", "/v1/workspaces", "", map[string]any{"name": "via-alias"})
}

func TestStrictDecoding(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	cases := []struct {
		name, body, field string
	}{
		{"unknown field", `{"name":"a","nmae":"b"}`, "nmae"},
		{"wrong type", `{"name": 5}`, "name"},
		{"malformed", `{"name":`, "body"},
		{"trailing data", `{"name":"a"} {"name":"b"}`, "body"},
		{"not an object", `[1,2]`, "body"},
		{"blank name", `{"name":"  "}`, "name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := env.Do("POST", "/api/v1/workspaces", "", tc.body)
			require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
			require.Equal(t, "invalid_request", r.ErrorCode())
			validation := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any)
			require.Equal(t, tc.field, validation[0].(map[string]any)["field"])
		})
	}
}

func TestOversizedBodyIs413AndChangesNothing(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	before := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil)
	big := `{"name":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `","preset":"AGENT"}`
	r := env.Do("POST", "/api/v1/keys", ws.Key, big)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	require.Equal(t, "payload_too_large", r.ErrorCode())
	after := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil)
	require.JSONEq(t, string(before.Body), string(after.Body))
}

func TestListLimitValidation(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, q := range []string{"limit=0", "limit=201", "limit=abc", "limit="} {
		r := env.Do("GET", "/api/v1/keys?"+q, ws.Key, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, q)
		require.Equal(t, "invalid_request", r.ErrorCode(), q)
	}
}

func TestKeyListPaginates(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for i := 0; i < 4; i++ {
		env.Key(ws, map[string]any{"name": "k", "preset": "AGENT"})
	}
	seen := map[string]bool{}
	cursor := ""
	pages := 0
	for {
		r := env.Must(http.StatusOK, "GET", "/api/v1/keys?limit=2&cursor="+cursor, ws.Key, nil)
		body := r.JSON()
		for _, k := range body["data"].([]any) {
			id := k.(map[string]any)["id"].(string)
			require.False(t, seen[id], "key %s listed twice", id)
			seen[id] = true
		}
		pages++
		next, ok := body["next_cursor"].(string)
		if !ok {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 5)
	require.Equal(t, 3, pages)
}

// A panic's value stays out of the log as well (logs QA: it was logged as
// it was, "secret-payload-value" here); its stack says where it was raised.
func TestPanicIs500WithRequestIDOnly(t *testing.T) {
	t.Parallel()
	var logs apitest.LockedBuffer
	env := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	d := env.App.Server.Deps
	srv := httptest.NewServer(httpapi.NewWithExtraRoutes(d, []httpapi.Route{
		{Method: "GET", Pattern: "/api/v1/test/panic", Name: "test.panic", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(context.Context, *httpapi.Call) (any, error) { panic("secret-payload-value") }},
		{Method: "GET", Pattern: "/api/v1/test/panic-error", Name: "test.panic_error", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(context.Context, *httpapi.Call) (any, error) { panic(errors.New("secret-payload-value")) }},
		{Method: "GET", Pattern: "/api/v1/test/panic-index", Name: "test.panic_index", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(_ context.Context, c *httpapi.Call) (any, error) {
				var rows []int
				return rows[len(c.RequestID)], nil
			}},
		{Method: "GET", Pattern: "/api/v1/test/fail", Name: "test.fail", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(context.Context, *httpapi.Call) (any, error) {
				return nil, errors.New("pq: password=hunter2 relation does not exist")
			}},
	}))
	defer srv.Close()
	for _, path := range []string{"/api/v1/test/panic", "/api/v1/test/panic-error", "/api/v1/test/panic-index", "/api/v1/test/fail"} {
		res, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		body := readAll(t, res)
		require.Equal(t, http.StatusInternalServerError, res.StatusCode)
		require.NotContains(t, body, "secret-payload-value")
		require.NotContains(t, body, "hunter2")
		require.Contains(t, body, `"internal_error"`)
		require.Contains(t, body, res.Header.Get("X-Request-Id"))
	}
	require.Contains(t, logs.String(), `panic="a string, its value withheld from logs"`)
	// An error's text may quote the request's data as a string's may; a
	// runtime error's names indexes and types only, and is kept.
	require.Contains(t, logs.String(), `panic="a *errors.errorString, its value withheld from logs"`)
	require.Contains(t, logs.String(), `panic="runtime error: index out of range [30] with length 0"`)
	require.Contains(t, logs.String(), "platform_test.go", "the stack")
	require.NotContains(t, logs.String(), "secret-payload-value")
}

// An answer that cannot be encoded is a 500 like any other: its body carries
// the request id (API.md: "500 internal_error carrying only a request id") and
// the failure is logged, not swallowed (QA: the encoder's fallback answered
// `"detail":{}` and logged nothing).
func TestUnencodableAnswerIs500WithRequestID(t *testing.T) {
	t.Parallel()
	var logs apitest.LockedBuffer
	env := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	h := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{
		{Method: "GET", Pattern: "/api/v1/test/unencodable", Name: "test.unencodable", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(context.Context, *httpapi.Call) (any, error) {
				return map[string]any{"ratio": math.NaN()}, nil
			}},
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/test/unencodable", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
	reqID := rec.Header().Get("X-Request-Id")
	require.NotEmpty(t, reqID)
	var body struct {
		Error struct {
			Code   string         `json:"code"`
			Detail map[string]any `json:"detail"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	require.Equal(t, "internal_error", body.Error.Code)
	require.Equal(t, map[string]any{"request_id": reqID}, body.Error.Detail)
	require.Contains(t, logs.String(), "route=test.unencodable")
	require.Contains(t, logs.String(), "encode the answer: *json.UnsupportedValueError")
}

// What an error quotes of a request's data stays out of the log, as out of
// the answer: a data exception's message quotes the value Postgres refused
// (QA: one provoked in a begin logged `invalid input syntax for type
// integer: "<the idempotency key>"` as its internal error, the comment on
// fail saying driver errors carry no values). The log keeps the SQLSTATE.
func TestInternalErrorLogsWithholdQuotedValues(t *testing.T) {
	t.Parallel()
	var logs apitest.LockedBuffer
	env := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	const marker = "SECRET-MARKER-123"
	h := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{
		{Method: "GET", Pattern: "/api/v1/test/cast", Name: "test.cast", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(ctx context.Context, _ *httpapi.Call) (any, error) {
				var n int
				err := env.App.Pool.QueryRow(ctx, `SELECT $1::text::int`, marker).Scan(&n)
				return nil, fmt.Errorf("test: %w", err)
			}},
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/test/cast", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
	require.NotContains(t, rec.Body.String(), marker)
	require.NotContains(t, rec.Body.String(), "SQLSTATE")
	require.Contains(t, logs.String(), "SQLSTATE 22P02")
	require.Contains(t, logs.String(), "route=test.cast")
	require.NotContains(t, logs.String(), marker)
}

// A client that goes away while its statement runs is 499, not an outage:
// the statement is cancelled on the server, whose "canceling statement"
// (57014) must not read as database_unavailable (nor log as one).
func TestClientGoneMidStatementIs499(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	h := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{
		{Method: "GET", Pattern: "/api/v1/test/sleep", Name: "test.sleep", Auth: httpapi.AuthNone, Status: 200,
			Handle: func(ctx context.Context, _ *httpapi.Call) (any, error) {
				_, err := env.App.Pool.Exec(ctx, `SELECT pg_sleep(10)`)
				return nil, err
			}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("GET", "/api/v1/test/sleep", nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { h.ServeHTTP(rec, req); close(done) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	require.Equal(t, 499, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "client_closed_request")
}

func TestErrorStatusesMatchTable(t *testing.T) {
	t.Parallel()
	for code, status := range apierr.Statuses {
		require.Equal(t, status, apierr.Of(code, "x").Status, code)
	}
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func TestRouteTimeoutIs503(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	srv := httptest.NewServer(httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{
		{Method: "GET", Pattern: "/api/v1/test/slow", Name: "test.slow", Auth: httpapi.AuthNone, Status: 200,
			Timeout: 20 * time.Millisecond,
			Handle: func(ctx context.Context, _ *httpapi.Call) (any, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}},
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL + "/api/v1/test/slow")
	require.NoError(t, err)
	body := readAll(t, res)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	require.Contains(t, body, "database_unavailable")
}

// A request's method is logged only when it is an HTTP method: any other
// token the client sends is "other" (security QA: it was logged verbatim,
// unauthenticated and unbounded).
func TestAnUnknownMethodIsNotLoggedVerbatim(t *testing.T) {
	t.Parallel()
	var logs apitest.LockedBuffer
	env := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for _, method := range []string{"MARKERMETHOD", strings.Repeat("M", 10_000)} {
		r := env.Do(method, "/api/v1/health", "", nil)
		require.Equal(t, http.StatusNotFound, r.Status)
	}
	env.Do("GET", "/api/v1/health", "", nil)
	require.NotContains(t, logs.String(), "MARKERMETHOD")
	require.NotContains(t, logs.String(), "MMMM")
	require.Contains(t, logs.String(), "method=other")
	require.Contains(t, logs.String(), "method=GET")
}

// requireLateBodyIs408 checks that h, whose route's time is
// lateRouteTimeout, answers 408 request_timeout to a body late for it: over
// a connection given head (the request and part of its body), its read cut
// at the deadline; and held by an adapter (newRequest's), body arriving
// whole after the deadline.
func requireLateBodyIs408(t *testing.T, h http.Handler, head, body string, newRequest func(io.Reader) *http.Request) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, head)
	require.NoError(t, err)
	// The answer comes at the deadline, not after the client's own wait.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the read was cut at the deadline, not left waiting")
	answer := readAll(t, res)
	require.Equal(t, http.StatusRequestTimeout, res.StatusCode, answer)
	require.Contains(t, answer, `"request_timeout"`)

	pr, pw := io.Pipe()
	go func() {
		time.Sleep(lateRouteTimeout + 500*time.Millisecond)
		_, _ = pw.Write([]byte(body))
		_ = pw.Close()
	}()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(pr))
	require.Equal(t, http.StatusRequestTimeout, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `"request_timeout"`)
}

// lateRouteTimeout is the time of TestABodyLateForTheRequestsTimeIs408's route.
const lateRouteTimeout = 1500 * time.Millisecond

// lateBody is the body of TestABodyLateForTheRequestsTimeIs408's route.
type lateBody struct {
	N int `json:"n"`
}

// A body that has not arrived when the request's time runs out is 408
// request_timeout, nothing done, not 503 database_unavailable "may have
// been applied" (security QA). Over a connection the read itself is cut at
// the deadline; where the server cannot cut it (an adapter holding the
// request), a body read whole after the deadline is refused the same way.
func TestABodyLateForTheRequestsTimeIs408(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	var ran atomic.Int32
	h := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{
		{Method: "POST", Pattern: "/api/v1/test/late", Name: "test.late", Auth: httpapi.AuthNone, Status: 200,
			// Long enough for the last request's statement on a loaded CI
			// machine (at 300 ms it ran out there now and then).
			Timeout: lateRouteTimeout, Request: lateBody{},
			Handle: func(ctx context.Context, c *httpapi.Call) (any, error) {
				var body lateBody
				if err := c.Decode(&body); err != nil {
					return nil, err
				}
				ran.Add(1)
				_, err := env.App.Pool.Exec(ctx, `SELECT 1`)
				return map[string]any{"n": body.N}, err
			}},
	})
	requireLateBodyIs408(t, h, "POST /api/v1/test/late HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 7\r\n\r\n{\"n\"", `{"n":1}`, func(body io.Reader) *http.Request {
		return httptest.NewRequest("POST", "/api/v1/test/late", body)
	})
	require.Zero(t, ran.Load(), "the route never acted")

	// In time, the same route answers.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/api/v1/test/late", strings.NewReader(`{"n":2}`)))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
}

// A cursor a list could never have handed out is 400 on every list (it
// answered some other page), and every list pages on the cursor it hands out.
func TestListCursorsAreChecked(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	env.Key(ws, map[string]any{"name": "k", "preset": "AGENT"})
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/email.send", ws.Key, map[string]any{"mode": "allow"})
	env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "email.send", "idempotency_key": "k1"})
	env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "sms.send", "idempotency_key": "k2"})
	env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key, map[string]any{"name": "a"})
	env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key, map[string]any{"name": "b"})
	for list, bads := range map[string][]string{
		"/api/v1/keys": nil, "/api/v1/effects": nil, "/api/v1/approvals": nil, "/api/v1/endpoints": nil,
		"/api/v1/webhooks": nil,
		// Effect types: any name the rule allows could be one.
		"/api/v1/policies": {"a b", "-x", "email/send"}, "/api/v1/circuits": {"a b", "*", "é"},
	} {
		if bads == nil {
			bads = []string{"garbage", "eff_", "job_01m8kjt9g002extbwvcndh4bkd", "a b"}
		}
		for _, bad := range bads {
			r := env.Do("GET", list+"?cursor="+url.QueryEscape(bad), ws.Key, nil)
			require.Equal(t, http.StatusBadRequest, r.Status, "%s %s: %s", list, bad, r.Body)
			require.Equal(t, "invalid_request", r.ErrorCode())
		}
		first := env.Must(http.StatusOK, "GET", list+"?limit=1", ws.Key, nil).JSON()
		next, _ := first["next_cursor"].(string)
		if next == "" {
			next, _ = first["nextCursor"].(string)
		}
		if next != "" {
			env.Must(http.StatusOK, "GET", list+"?limit=1&cursor="+url.QueryEscape(next), ws.Key, nil)
		}
	}
}

// A deadlock's victim that the retry gave up on (db.RetryDeadlocks) was
// rolled back: 503 database_unavailable saying nothing was applied, for the
// client to retry, never a 500.
func TestADeadlocksVictimIs503NotApplied(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	h := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{
		{Method: "POST", Pattern: "/api/v1/test/deadlock", Name: "test.deadlock", Auth: httpapi.AuthNone, Status: 200,
			Timeout: 5 * time.Second,
			Handle: func(ctx context.Context, c *httpapi.Call) (any, error) {
				return nil, fmt.Errorf("report: %w", &pgconn.PgError{Code: db.CodeDeadlockDetected, Message: "deadlock detected"})
			}},
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/api/v1/test/deadlock", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `"code":"database_unavailable"`)
	require.Contains(t, rec.Body.String(), `"outcome":"not_applied"`)
}
