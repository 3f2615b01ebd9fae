package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/toolname"
)

// MaxBodyBytes is the published request body limit.
const MaxBodyBytes = 1 << 20

// Decode reads the JSON body into dst strictly: unknown fields, trailing
// data, wrong types and malformed JSON are 400 invalid_request naming the
// field; an oversized body is 413. An empty body decodes as {}.
func (c *Call) Decode(dst any) error {
	body, err := c.Body()
	if err != nil {
		return err
	}
	return DecodeJSON(body, dst)
}

// Body reads the request body whole, within MaxBodyBytes (readBody).
func (c *Call) Body() ([]byte, error) { return readBody(c.R) }

// readBody reads r's body whole, within MaxBodyBytes (413 beyond), for the
// routes (Call.Body) and the MCP endpoint alike.
//
// A body whose Content-Length is over the limit is refused before any of it
// is read: it cannot be within it (edge QA: a declared 100 GB was waited
// on until the request's time ran out, and answered 408 on a route, 400
// "could not be read" after a minute on the MCP endpoint).
//
// A body that has not arrived when the request's time runs out is a 408
// request_timeout, nothing done (security QA: one held back past the
// deadline reached the route with its time spent, and its first statement
// answered 503 database_unavailable, "may have been applied"). The read
// itself is cut at that time where the server allows (ServeHTTP sets the
// connection's read deadline).
func readBody(r *http.Request) ([]byte, error) {
	if e := refuseContentEncoding(r); e != nil {
		return nil, e
	}
	if r.ContentLength > MaxBodyBytes {
		// Left unread: net/http then answers with Connection: close and
		// shuts the connection, rather than read the rest as the next
		// request (ServeHTTP keeps its own request's body for it to see).
		return nil, apierr.PayloadTooLarge(MaxBodyBytes)
	}
	body, err := io.ReadAll(r.Body)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, apierr.PayloadTooLarge(MaxBodyBytes)
	case errors.Is(err, os.ErrDeadlineExceeded) || r.Context().Err() != nil:
		return nil, apierr.RequestTimeout()
	case err != nil:
		return nil, apierr.InvalidField("body", "could not be read")
	}
	return body, nil
}

// refuseContentEncoding refuses a body sent with a Content-Encoding other
// than identity: nothing decompresses one, and a gzipped body read as "not
// valid JSON (offset 1)" (QA). It says what is wrong before the body is read.
func refuseContentEncoding(r *http.Request) *apierr.Error {
	enc := r.Header.Values("Content-Encoding")
	if len(enc) == 0 || (len(enc) == 1 && (enc[0] == "" || strings.EqualFold(enc[0], "identity"))) {
		return nil
	}
	return apierr.InvalidField("Content-Encoding", "is not supported: send the body uncompressed")
}

// DecodeJSON is Decode over bytes (jsonstrict.Decode).
func DecodeJSON(body []byte, dst any) error { return jsonstrict.Decode(body, dst) }

// PathID returns path parameter name, answering 404 when it is not a
// well-formed id with prefix (so malformed ids cost no query).
func (c *Call) PathID(name, prefix string) (string, error) {
	v := c.R.PathValue(name)
	if !ids.Valid(prefix, v) {
		return "", apierr.NotFound(pathResource(c.Route.Pattern, name))
	}
	return v, nil
}

// BoolParam parses ?name=, a switch: true or false, false when it is not
// given. Any other value (an empty one, 1, TRUE) is 400 at name, not read
// as either: a switch that revokes keys is not guessed at.
func (c *Call) BoolParam(name string) (bool, error) {
	q := c.R.URL.Query()
	if !q.Has(name) {
		return false, nil
	}
	switch q.Get(name) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, apierr.InvalidField(name, "must be true or false")
}

// ListParams parses ?limit= (1-200, default 50) and ?cursor=. A cursor is
// what the list's own nextCursor held: the route's Cursor says whether it
// can be one, so a mistyped cursor is 400 rather than a silently different
// page. knownQuery has checked both, with the query's other parameters
// (one answer names them all); these checks, by the same rules
// (refusedValue), only stand behind it.
func (c *Call) ListParams() (limit int, cursor string, err error) {
	q := c.R.URL.Query()
	for _, p := range pageParams("") {
		if v := q.Get(p.Name); q.Has(p.Name) {
			if rule, bad := refusedValue(c.Route, p, v); bad {
				return 0, "", apierr.InvalidField(p.Name, "%s", rule)
			}
		}
	}
	limit = 50
	if q.Has("limit") {
		limit, _ = strconv.Atoi(q.Get("limit")) // refusedValue took it
	}
	return limit, q.Get("cursor"), nil
}

// maxCursorBytes bounds a cursor: it admits the longest one a list
// answers, queue health's name@version (200 and 100 characters, each up to
// 4 bytes of UTF-8). At 200 bytes, a page ending on a tool with a long name
// answered a nextCursor the next request refused, 400 (QA, fuzzing the tool
// name rule), and the queues after it could not be listed.
const maxCursorBytes = 4*(toolname.MaxName+toolname.MaxVersion) + len("@")

// idCursor accepts an id of one kind as a cursor.
func idCursor(prefix string) func(string) bool {
	return func(s string) bool { return ids.Valid(prefix, s) }
}

// Page is the list envelope of snake_case routes.
type Page[T any] struct {
	Data       []T     `json:"data" openapi:"notNull"` // always an array (encodePage)
	NextCursor *string `json:"next_cursor"`
}

// CamelPage is the list envelope of camelCase (durable-job) routes.
type CamelPage[T any] struct {
	Data       []T     `json:"data" openapi:"notNull"` // always an array (encodePage)
	NextCursor *string `json:"nextCursor"`
}

// NewPage builds a page from items fetched with limit+1, using cursorOf on
// the last answered item when there are more. The page is encoded as it is
// built, each item once, and ends early, with the usual next_cursor, before
// an item would take it past the answer's budget (answer.Of: answer.Budget,
// or what the MCP endpoint leaves a call of a batch), always with at least
// one item: a page holds at most limit items and at most about 4 MB, as a
// DynamoDB page holds at most 1 MB. A list's items may carry previews,
// messages and keys of up to a few KB each, so 200 of them could pass what
// Vercel (4.5 MB) and Lambda (6 MB) deliver, and the page was lost (QA).
func NewPage[T any](ctx context.Context, items []T, limit int, cursorOf func(T) string) (any, error) {
	return encodePage(ctx, items, limit, cursorOf, `],"next_cursor":`)
}

// NewCamelPage is NewPage for camelCase routes.
func NewCamelPage[T any](ctx context.Context, items []T, limit int, cursorOf func(T) string) (any, error) {
	return encodePage(ctx, items, limit, cursorOf, `],"nextCursor":`)
}

// encodePage writes Page or CamelPage (cursorMember names the next cursor,
// after the closing bracket of data) within answer.Of(ctx).
func encodePage[T any](ctx context.Context, items []T, limit int, cursorOf func(T) string,
	cursorMember string) (rawAnswer, error) {
	budget := answer.Of(ctx)
	e := jsonx.NewEncoder()
	e.Raw(`{"data":[`)
	kept := 0
	for i := 0; i < len(items) && i < limit; i++ {
		mark := e.Len()
		if i > 0 {
			e.Raw(",")
		}
		if err := e.Value(items[i]); err != nil {
			return nil, fmt.Errorf("encode page: %w", err)
		}
		// What the page would end with after this item: its cursor, when
		// more follow, or null.
		tail := len(cursorMember) + len("null}")
		if i+1 < len(items) {
			tail = len(cursorMember) + jsonx.StringLen(cursorOf(items[i])) + len("}")
		}
		if i > 0 && e.Len()+tail > budget {
			e.Truncate(mark)
			break
		}
		kept++
	}
	e.Raw(cursorMember)
	if kept < len(items) {
		if err := e.Value(cursorOf(items[kept-1])); err != nil {
			return nil, fmt.Errorf("encode page: %w", err)
		}
	} else {
		e.Raw("null")
	}
	e.Raw("}")
	return rawAnswer(e.Bytes()), nil
}

// rawAnswer is an answer's JSON written already (a page measured as it was
// built): the router writes it as it is, and json.Marshal answers it.
type rawAnswer []byte

// MarshalJSON answers the JSON as written.
func (a rawAnswer) MarshalJSON() ([]byte, error) { return a, nil }

// errorBody is the envelope of every failure.
type errorBody struct {
	Error apierr.Wire `json:"error"`
}

// writeJSON writes body without HTML escaping (jsonx.Marshal): escaping
// turns each <, > and & of a job's input into six bytes, so a claim measured
// against ClaimInputBudget by its stored inputs could pass the platforms'
// answer limits all the same (review).
// The answer is encoded in a pooled buffer (jsonx.Borrow), written as
// jsonx.Marshal would answer it: a ResponseWriter copies what it is given.
func writeJSON(w http.ResponseWriter, status int, body any) {
	if err := tryWriteJSON(w, status, body); err != nil {
		writeEncoded(w, encoded{status: http.StatusInternalServerError,
			body: []byte(`{"error":{"code":"internal_error","message":"Internal error.","detail":{}}}`)})
	}
}

// tryWriteJSON is writeJSON that writes nothing when body cannot be encoded
// and says why, so that a route's answer fails as any 500 does (logged, its
// request id in the detail: Server.fail).
func tryWriteJSON(w http.ResponseWriter, status int, body any) error {
	e := jsonx.Borrow()
	defer e.Release()
	if err := e.Value(body); err != nil {
		return err
	}
	writeEncoded(w, encoded{status: status, body: e.Bytes()})
	return nil
}

var newline = []byte("\n")

// WriteOutsideError answers e for an entry point that could not reach the
// router (a Vercel instance that failed to start, a Lambda event that is not
// a request): a fresh request id in the header, and in the body's detail for
// a 5xx, as the router answers them.
func WriteOutsideError(w http.ResponseWriter, e *apierr.Error) {
	reqID := ids.New(ids.Request)
	w.Header().Set(RequestIDHeader, reqID)
	noSniff(w)
	if e.Status >= 500 {
		e = e.WithDetail("request_id", reqID)
	}
	writeError(w, e)
}

// StartFailed answers every request an instance could not start for (a
// Vercel function's, a Lambda's, on each request while the cause lasts):
// 503 database_unavailable when the database was out of reach, else 500 for
// a configuration to fix. The error names the setting, never its value;
// the log says what failed. (QA: on Lambda the process exited, and each
// request got the Function URL's bare 502.)
func StartFailed(err error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		redact.Logger(nil).Error("start-up failed", "err", err)
		e := apierr.New(http.StatusInternalServerError, apierr.CodeInternal,
			"The service is misconfigured; see the function logs.")
		if db.IsUnavailable(err) {
			e = apierr.DatabaseUnavailable(err)
		}
		WriteOutsideError(w, e)
	})
}

func writeError(w http.ResponseWriter, e *apierr.Error) {
	if e.Status == http.StatusUnauthorized {
		// RFC 9110 §15.5.2: a 401 names the scheme that would answer it
		// (QA: clients tell "authenticate" from other refusals by it).
		w.Header().Set("WWW-Authenticate", `Bearer realm="ratchet"`)
	}
	if e.Status == http.StatusTooManyRequests || e.Code == apierr.CodeRetryRequest {
		if s, ok := e.Detail["retry_after_seconds"].(int); ok {
			w.Header().Set("Retry-After", fmt.Sprint(s))
		}
	}
	writeJSON(w, e.Status, errorBody{Error: e.Wire()})
}
