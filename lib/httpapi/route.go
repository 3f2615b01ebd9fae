// Package httpapi is the HTTP surface of Ratchet: one route table from which
// the router, the Vercel entry files, vercel.json, the OpenAPI document, the
// capability manifest and llms.txt are all derived, so none can drift.
package httpapi

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/getratchet/ratchet/lib/auth"
)

// AuthMode says how a route authenticates its caller.
type AuthMode int

const (
	// AuthKey requires a bearer API key (the default).
	AuthKey AuthMode = iota
	// AuthNone is public: signup, health, discovery.
	AuthNone
	// AuthCron requires Authorization: Bearer $CRON_SECRET.
	AuthCron
)

// Param documents a query parameter.
type Param struct {
	Name        string
	Description string
	Type        string   // "string", "integer" or "boolean" (true or false: Call.BoolParam)
	Min, Max    *int     // an integer's bounds, when it has them
	Default     *int     // an integer's value when it is not given, when it has one
	Enum        []string // a string's values, when it takes only those
	Pattern     string   // a string's pattern, when it has one
	MaxLength   int      // a string's longest length, when it has one
	// Valid, when set, says whether a string is a value the parameter
	// takes (its Enum is checked without it, an integer's Min and Max
	// too), and Rule what it must be, the refusal's words, when the
	// generated ones ("must be A, B or C") are not meant (knownQuery).
	Valid func(string) bool
	Rule  string
}

// Route is one method on one path.
type Route struct {
	Method  string
	Pattern string // Go ServeMux path pattern, e.g. /api/v1/effects/{id}/report
	Name    string // stable operation id, e.g. effects.report
	Summary string
	Tag     string
	Auth    AuthMode
	Scopes  []string // every one is required
	// Cursor says what a list's ?cursor= may hold: what its nextCursor
	// held (an id of the listed kind, an effect type, ...). knownQuery
	// refuses another, with the query's other problems, so a mistyped
	// cursor is 400 rather than a silently different page.
	Cursor func(string) bool
	// AnyScopes, when set, are alternatives: one of them is required too
	// (a read open to a key that may read and to one that may write).
	AnyScopes []string
	// Settles marks a route that settles what a counted call began (a
	// report, a heartbeat): it is counted in the key's settling bucket, not
	// against its limit (auth.AuthenticateSettling). QA: a report refused
	// by the limit turned an outcome the holder knew into an unknown one,
	// and under on_indeterminate retry the key's next begin was told to act
	// again; a refused job heartbeat lapses a lease.
	Settles bool
	// ChecksKey marks a call that changes something and whose own
	// statements refuse a revoked key (auth.LiveKeySQL, auth.RequireLive):
	// a begin, an enqueue, a claim, a key's mint or revoke... It may take
	// the key from the instance's cache. Any other call that changes
	// something, settling calls aside, reads its key afresh
	// (auth.AuthenticateUncached) and has every transaction it begins
	// hold the key's row live before it commits (checksKeyAsItWrites), so
	// a key revoked on another instance, or as the call ran, changes
	// nothing.
	ChecksKey bool
	Query     []Param
	// Request and Response are zero values of the body types, used for the
	// OpenAPI schemas; nil means no body. Text responses set ContentType.
	Request     any
	Response    any
	ContentType string
	Status      int // success status
	// DedupOK documents that a create (Status 201) answers 200 with the same
	// body when it finds what it would create (a deduplicated enqueue).
	DedupOK bool
	// Idempotent marks a route that takes an Idempotency-Key header: its
	// success is kept a day and given again to the same request from the
	// same key (lib/idempotency, Server.runOnce). A create with no
	// idempotency key of its own takes it, and so does an action that sets
	// a state another actor may set back (a breaker's close, a step's
	// cancel, an endpoint's pause), whose repeat after a lost answer would
	// otherwise undo that actor's change. Other routes ignore the header.
	// Such a route declares its Request body, which the key is compared
	// over (mustKeyABody refuses one that does not; struct{}{} with
	// bodiless for an action without one).
	Idempotent bool
	// Bodiless lists other success statuses the route answers without a
	// body, with what each means (MCP's 202 to a notification).
	Bodiless map[int]string
	Errors   []string // error codes this route can answer beyond the common ones
	// ErrorBodies are bodies an error status may carry instead of the bare
	// envelope: the envelope with more fields (begin's 403 denied
	// decision), or another body the route answers (MCP's JSON-RPC error).
	ErrorBodies map[int]any
	// Timeout bounds the whole request, database work included; zero means
	// DefaultTimeout. Long-polling routes set their own.
	Timeout time.Duration
	Handle  HandlerFunc
	// Raw serves the request itself instead of Handle (a protocol endpoint
	// such as MCP that speaks its own framing). The request id, body limit,
	// logging and the route's Auth still apply.
	Raw http.Handler
	// Acts marks a GET that does work (the cron sweep, which Vercel cron
	// calls with GET): HEAD, answered elsewhere as GET without its body,
	// is an unknown route on its path rather than a run of that work.
	Acts bool
}

// DefaultTimeout bounds a request that names no Timeout.
const DefaultTimeout = 15 * time.Second

// FunctionTimeout is the functions' own limit: vercel.json's maxDuration
// and the API function's Timeout in template.yaml. The platform stops a
// function there, without an answer.
const FunctionTimeout = 30 * time.Second

// AnswerMargin is what every route's Timeout leaves of FunctionTimeout, so
// that a request out of its time is still answered (503 in the envelope)
// before the platform stops the function.
const AnswerMargin = 2 * time.Second

// CronTimeout bounds a cron sweep: under vercel.json's maxDuration (30 s) and
// the Lambda API function's timeout (template.yaml, 30 s), and long enough
// that a task stuck to its own limit leaves the others time (sweep.RunOnce)
// and webhook delivery its round (a send and its record, 15 s).
const CronTimeout = 27 * time.Second

// HandlerFunc does a route's work. It returns the body to encode with the
// route's status, a Reply to choose another status, or an error.
type HandlerFunc func(ctx context.Context, c *Call) (any, error)

// Reply overrides a route's success status (for example 200 for a deduplicated
// create, or 403 for a denied begin that still carries a decision body).
type Reply struct {
	Status int
	Body   any
}

// Text is a non-JSON response body.
type Text struct {
	ContentType string
	Body        string
}

// Call is one request as a handler sees it.
type Call struct {
	R         *http.Request
	Principal *auth.Principal // nil on AuthNone and AuthCron routes
	RequestID string
	Route     *Route
}

var pathParam = regexp.MustCompile(`\{([a-zA-Z_]+)\}`)

// pathParamsOf holds each pattern's PathParams: every request's checks
// read them (textParams, knownQuery), and a pattern's never change.
var pathParamsOf sync.Map // pattern → []string

// PathParams lists the pattern's parameter names in order. The slice is
// shared by every caller: read it, never change it.
func (r *Route) PathParams() []string {
	if v, ok := pathParamsOf.Load(r.Pattern); ok {
		return v.([]string)
	}
	var out []string
	for _, m := range pathParam.FindAllStringSubmatch(r.Pattern, -1) {
		out = append(out, m[1])
	}
	pathParamsOf.Store(r.Pattern, out)
	return out
}

// OpenAPIPath is the pattern in OpenAPI form (the same braces).
func (r *Route) OpenAPIPath() string { return r.Pattern }

// changes says whether the route may change something: any method but GET.
func (r *Route) changes() bool { return r.Method != http.MethodGet }

// checksKeyAsItWrites says whether the route's key is read afresh and held
// live by every transaction the route begins, before it commits
// (Server.run, db.WithCheck):
// a keyed call that changes something, neither settling what was begun
// nor checking the key in its own statements (ChecksKey).
func (r *Route) checksKeyAsItWrites() bool {
	return r.Auth == AuthKey && r.changes() && !r.Settles && !r.ChecksKey
}

// IsAPI reports whether the route lives under /api/v1.
func (r *Route) IsAPI() bool { return strings.HasPrefix(r.Pattern, "/api/v1/") }

func ptr[T any](v T) *T { return &v }
