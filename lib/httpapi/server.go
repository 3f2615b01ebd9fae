package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/sweep"
)

// Deps are everything the routes need. Each domain service is built once per
// instance (lib/app) and shared by all requests.
type Deps struct {
	Config  *config.Config
	Pool    *pgxpool.Pool
	Auth    *auth.Service
	Sealer  *seal.Sealer
	Sweeper *sweep.Sweeper
	// Idempotency keeps the answers of creates sent with an
	// Idempotency-Key header (Route.Idempotent).
	Idempotency *idempotency.Store
	Logger      *slog.Logger
	Now         func() time.Time
	Domain
}

// Server routes requests to handlers.
type Server struct {
	Deps
	mux    *http.ServeMux
	groups map[string]*group // by pattern
	mcp    mcpEndpoint

	// cronUnsetLogged and cronUnsetWarned are set once the refusal of the
	// cron route for want of CRON_SECRET was logged, of Vercel's schedule
	// and of another caller (logCronUnset): once per instance says it, and
	// the route is public (on a Lambda Function URL anyone could otherwise
	// write a line per request into the log and set off its alarms).
	cronUnsetLogged atomic.Bool
	cronUnsetWarned atomic.Bool
}

// group is every route sharing one path pattern: the unit of a Vercel
// function file and of one ServeMux registration.
type group struct {
	pattern string
	params  []string
	routes  map[string]*Route // by method
}

// New builds the server and its router from the route table.
func New(d Deps) *Server { return newWithRoutes(d, (*Server).routes) }

// newWithRoutes builds a server over another table (tests add failing routes).
func newWithRoutes(d Deps, table func(*Server) []Route) *Server {
	// Errors are logged as redact.ErrorText has them, whoever built the
	// logger (a nil one is slog's default).
	d.Logger = redact.Logger(d.Logger)
	if d.Now == nil {
		d.Now = time.Now
	}
	s := &Server{Deps: d, mux: http.NewServeMux(), groups: map[string]*group{}}
	for _, r := range append(table(s), consoleRoutes()...) {
		mustKeyABody(r)
		g, ok := s.groups[r.Pattern]
		if !ok {
			g = &group{pattern: r.Pattern, params: r.PathParams(), routes: map[string]*Route{}}
			s.groups[r.Pattern] = g
			s.mux.Handle(r.Pattern, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				s.serveGroup(w, req, g)
			}))
		}
		g.routes[r.Method] = &r
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		s.serveGroup(w, req, nil)
	})
	return s
}

// mustKeyABody refuses, at start, a route that takes an Idempotency-Key
// (Idempotent) without declaring the body its key is compared over
// (Request): Server.run decodes a bodiless route's body (nothing, or {})
// before runOnce reads it, so every such request would be hashed as an
// empty body, and a protocol endpoint (Raw) never reaches runOnce at all.
// None does today: every route that takes the header declares one, the
// bodiless actions struct{}{}.
func mustKeyABody(r Route) {
	if r.Idempotent && (r.Request == nil || r.Raw != nil) {
		panic(fmt.Sprintf("httpapi: route %s (%s %s) takes an Idempotency-Key but declares no request body "+
			"to compare it over: set Request (struct{}{} for a body of none), or drop Idempotent", r.Name, r.Method,
			r.Pattern))
	}
}

// Routes returns the route table (handlers unbound), for documentation and
// drift checks.
func Routes() []Route { return (&Server{}).routes() }

// ServeHTTP serves /api/v1/... and the legacy /v1/... alias.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.EscapedPath(); strings.Contains(p, "//") || strings.Contains(p, "/./") || strings.Contains(p, "/../") ||
		strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") {
		// An empty or dot segment (an id left blank: /runs//steps) names
		// no route. The mux would redirect it to its cleaned path, a bare
		// 307 to some other route; answer 404 in the envelope instead.
		// The segments are the path's as sent: a '/' sent as %2F is part
		// of a segment (a tool named x/.. is /tools/x%2F../contracts).
		s.serveGroup(w, r, nil)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/api" + r.URL.Path
		if r.URL.RawPath != "" {
			r2.URL.RawPath = "/api" + r.URL.RawPath // a %2F stays one segment's
		}
		r = r2
	}
	s.mux.ServeHTTP(w, r)
}

// ServeRoute serves one path pattern directly, taking path parameters from
// the query string. Vercel entry files use it: Go cannot name a directory
// [id], so vercel.json rewrites /api/v1/effects/:id/report to the report
// file with ?id=:id. Vercel serves a file before any rewrite, so a path
// whose segment is literally the file's (a tool named "name") arrives
// without the query parameters: the router matches it then, as on the local
// server.
func (s *Server) ServeRoute(w http.ResponseWriter, r *http.Request, pattern string) {
	g := s.groups[pattern]
	if g != nil {
		for _, p := range g.params {
			v, rest, ok := rewrittenParam(r.URL.RawQuery, p)
			if !ok {
				s.ServeHTTP(w, r)
				return
			}
			r.SetPathValue(p, v)
			r.URL.RawQuery = rest
		}
	}
	s.serveGroup(w, r, g)
}

// rewrittenParam takes path parameter name out of the query vercel.json's
// rewrite built (?name=:name, its first occurrence), answering its value
// and the query without it, so that the route reads the client's own query
// only. The value is a path segment copied into the query, so it is
// decoded as a path segment is: a '+' stays a plus (a tool named c++ read
// as "c  " and was refused, on Vercel only: deployment review). ok is false
// when the parameter is missing or its escapes are malformed.
func rewrittenParam(rawQuery, name string) (value, rest string, ok bool) {
	pairs := strings.Split(rawQuery, "&")
	for i, pair := range pairs {
		key, val, _ := strings.Cut(pair, "=")
		if k, err := url.QueryUnescape(key); err != nil || k != name {
			continue
		}
		v, err := url.PathUnescape(val)
		if err != nil {
			return "", "", false
		}
		return v, strings.Join(slices.Delete(pairs, i, i+1), "&"), true
	}
	return "", "", false
}

// RequestIDHeader carries every response's request id (API.md §0).
const RequestIDHeader = "X-Request-Id"

// noSniff tells browsers to take a response's Content-Type as sent, never
// to guess another from its bytes: answers echo text that agents and
// callers wrote (effect types, idempotency keys, names, refused field
// names), which a browser sniffing one as HTML would run (security review:
// only the console's files said so).
func noSniff(w http.ResponseWriter) { w.Header().Set("X-Content-Type-Options", "nosniff") }

func (s *Server) serveGroup(w http.ResponseWriter, r *http.Request, g *group) {
	// The instance's own clock: it times the request (monotonic) and
	// stamps its id, and decides nothing. s.Now, the database's clock,
	// opens a connection to read it at a cold start, which a route that
	// needs no database (the OpenAPI document, health's own bounded
	// check) then waited for (clock QA).
	start := time.Now()
	reqID := ids.NewAt(ids.Request, start)
	w.Header().Set(RequestIDHeader, reqID)
	noSniff(w)
	sw := &statusWriter{ResponseWriter: w}
	var route *Route
	defer func() {
		if p := recover(); p != nil {
			// Log the panic and stack, never the request body.
			s.Logger.Error("panic", "request_id", reqID, "panic", panicValue(p), "stack", string(debug.Stack()))
			if sw.status == 0 {
				writeError(sw, internalError(reqID))
			}
		}
		name := ""
		if route != nil {
			name = route.Name
		}
		// As Info with these pairs writes it, without boxing each value.
		s.Logger.LogAttrs(context.Background(), slog.LevelInfo, "request", slog.String("request_id", reqID),
			slog.String("method", loggedMethod(r.Method)), slog.String("route", name), slog.Int("status", sw.status),
			slog.Int64("ms", time.Since(start).Milliseconds()))
	}()

	if g == nil {
		writeError(sw, apierr.New(http.StatusNotFound, apierr.CodeNotFound, "No such route; see /api/v1/openapi.json."))
		return
	}
	route = g.routes[r.Method]
	if get := g.routes[http.MethodGet]; route == nil && r.Method == http.MethodHead && get != nil && !get.Acts {
		route = get
	}
	if route == nil {
		allow := make([]string, 0, len(g.routes))
		for m, rt := range g.routes {
			if rt.Status != http.StatusMethodNotAllowed { // a route that only refuses is not allowed
				allow = append(allow, m)
			}
		}
		sort.Strings(allow)
		// A route is a method on a path: API.md answers any other
		// combination as an unknown route (404 not_found). Allow still says
		// which methods the path takes.
		sw.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(sw, apierr.New(http.StatusNotFound, apierr.CodeNotFound,
			"No such route; this path takes %s.", strings.Join(allow, " or ")))
		return
	}
	// The limit is set on a copy of the request: after the handler,
	// net/http looks at its own request's body, and only while that is
	// still its own does it see a large body left unread (one readBody
	// refuses unread, one a 401 never reads) and answer at once, closing
	// the connection. On the limit's wrapper it first read up to 256 KB
	// more, holding the answer back until they came or the read deadline
	// passed (edge QA: a 401 to a request declaring 100 GB took 15 s).
	// Given the server's own writer, the limit closes the connection as it
	// is reached. A route's request runs within its Timeout, set on that
	// same copy (one copy, not two). A protocol endpoint (Raw) is not
	// bounded so: the transport writes nothing once its request's context
	// ends. One that declares a Timeout (MCP) is handed it (RouteTime) to
	// bound its own work by, and its body is read within it as a route's is
	// (below): a slow body was 400 at the server's read timeout, not 408.
	ctx := r.Context()
	if route.Raw == nil || route.Timeout != 0 {
		timeout := route.Timeout
		if timeout == 0 {
			timeout = DefaultTimeout
		}
		bounded, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if route.Raw == nil {
			ctx = bounded
		} else {
			ctx = context.WithValue(ctx, routeTimeKey{}, bounded)
			readWithin(bounded, w, r)
		}
	}
	r = r.WithContext(ctx)
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	if route.Raw != nil {
		// A protocol endpoint's requests are not counted against the key's
		// rate limit: each call it makes through the router is.
		err := s.authorize(r.Context(), &Call{R: r, RequestID: reqID, Route: route}, false)
		if err == nil && route.Auth == AuthKey {
			err = knownQuery(r, route) // QA: /mcp?x=1 was served
		}
		if err != nil {
			s.fail(r.Context(), sw, reqID, route, err)
			return
		}
		route.Raw.ServeHTTP(sw, r)
		return
	}
	// The body must arrive within the request's time (Call.Body): the
	// connection's reads are cut then, where the server allows it (not
	// Lambda's adapter, which has the whole body already). net/http clears
	// the deadline once the body is read, before watching for the client
	// going away, so a long poll is not cut; a request without a body is
	// watched from the start, and is left alone.
	readWithin(ctx, w, r)
	call := &Call{R: r, RequestID: reqID, Route: route}
	body, err := s.run(ctx, call)
	if err != nil {
		s.fail(ctx, sw, reqID, route, err)
		return
	}
	status := route.Status
	if rep, ok := body.(Reply); ok {
		status, body = rep.Status, rep.Body
	}
	if a, ok := body.(encoded); ok {
		writeEncoded(sw, a)
		return
	}
	if raw, ok := body.(rawAnswer); ok {
		writeEncoded(sw, encoded{status: status, body: raw})
		return
	}
	if t, ok := body.(Text); ok {
		sw.Header().Set("Content-Type", t.ContentType)
		sw.WriteHeader(status)
		_, _ = sw.Write([]byte(t.Body))
		return
	}
	if err := tryWriteJSON(sw, status, body); err != nil {
		// Its type only: a Marshaler's error may quote the value it refused.
		s.fail(ctx, sw, reqID, route, fmt.Errorf("encode the answer: %T", err))
	}
}

// readWithin cuts the connection's reads of r's body at ctx's deadline,
// where the server allows it (serveGroup).
func readWithin(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	if deadline, ok := ctx.Deadline(); ok && r.ContentLength != 0 {
		_ = http.NewResponseController(w).SetReadDeadline(deadline)
	}
}

// routeTimeKey holds a protocol endpoint's request's context bounded by its
// route's Timeout (RouteTime).
type routeTimeKey struct{}

// RouteTime is ctx, a protocol endpoint's request's, bounded by its
// route's Timeout, when the route declares one: the transport keeps the
// request's own, so that it can still answer once the work it bounds has
// been stopped.
func RouteTime(ctx context.Context) (context.Context, bool) {
	bounded, ok := ctx.Value(routeTimeKey{}).(context.Context)
	return bounded, ok
}

func (s *Server) run(ctx context.Context, c *Call) (any, error) {
	if err := s.authorize(ctx, c, true); err != nil {
		return nil, err
	}
	if c.Route.checksKeyAsItWrites() {
		// Read live just now, the key may be revoked before the route
		// writes: every transaction the route begins holds its row live
		// before it commits, so a revocation either waits for the write's
		// commit or, committed before, refuses the write (401, as a
		// revoked key).
		keyID := c.Principal.KeyID
		ctx = db.WithCheck(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return auth.RequireLive(ctx, tx, keyID)
		})
	}
	if err := textParams(c.R, c.Route.Pattern, c.Route.PathParams()); err != nil {
		return nil, err
	}
	if c.Route.Auth == AuthKey {
		if err := knownQuery(c.R, c.Route); err != nil {
			return nil, err
		}
	}
	if refusesAnyField(*c.Route) && c.R.ContentLength != 0 {
		// An action without a body (finish, cancel, pause, the cron sweep,
		// ...) and a read still refuse unknown fields (API.md §0): a read's
		// body was ignored, so GET /runs?limit=5 with {"limit":500} answered
		// as if the client's filter held. An empty body or {} is fine.
		var none struct{}
		if err := c.Decode(&none); err != nil {
			return nil, err
		}
	}
	if c.Route.Idempotent {
		if keys, ok := c.R.Header[idempotency.Header]; ok {
			return s.runOnce(ctx, c, keys)
		}
	}
	return c.Route.Handle(ctx, c)
}

// pathResource is what the path segment before {name} in pattern names,
// in the singular ("/api/v1/runs/{id}" → "run").
func pathResource(pattern, name string) string {
	before, _, _ := strings.Cut(pattern, "/{"+name+"}")
	return strings.TrimSuffix(before[strings.LastIndex(before, "/")+1:], "s")
}

// textParams refuses a path or query parameter that is not UTF-8 text or
// holds a NUL, on every route at once: PostgreSQL stores neither in text, so
// a cursor, a filter or a tool name carrying one failed its statement (500).
// An id that is not such text names nothing stored: 404, as any unknown id
// is (API.md §0); a name (a tool's, an effect type) is a 400 at its field.
func textParams(r *http.Request, pattern string, pathParams []string) error {
	for _, name := range pathParams {
		if v := r.PathValue(name); !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			if isIDParam(name) {
				return apierr.NotFound(pathResource(pattern, name))
			}
			return apierr.InvalidField(name, "must be UTF-8 text without NUL characters")
		}
	}
	if r.URL.RawQuery == "" {
		return nil // no query parameter (r.URL.Query would parse "" into an empty map)
	}
	for name, values := range r.URL.Query() {
		for _, v := range values {
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				return apierr.InvalidField(strings.ToValidUTF8(name, "\uFFFD"), "must be UTF-8 text without NUL characters")
			}
		}
	}
	return nil
}

// isIDParam says whether a path parameter holds an id (an unknown one is
// 404) rather than a name (a malformed one is 400 at its field).
func isIDParam(name string) bool { return name == "id" || strings.HasSuffix(name, "Id") }

// undecodableQuery names the first query parameter that cannot be decoded
// (a bad percent escape, a ';' separator): url.Values leaves such a pair
// out silently, so ?limit=%zz listed a default page instead of refusing
// the limit (contract QA). A name that cannot be decoded either is named
// "query".
func undecodableQuery(raw string) (string, bool) {
	for pair := range strings.SplitSeq(raw, "&") {
		if pair == "" {
			continue
		}
		key, value, _ := strings.Cut(pair, "=")
		name, kerr := url.QueryUnescape(key)
		_, verr := url.QueryUnescape(value)
		switch {
		case kerr != nil || strings.Contains(key, ";") || !utf8.ValidString(name):
			return "query", true
		case verr != nil || strings.Contains(value, ";"):
			return name, true
		}
	}
	return "", false
}

// maxQueryParams is the most parameters net/url reads in one query (its
// default; GODEBUG urlmaxqueryparams may lower it, and knownQuery refuses
// what it then cannot read all the same). The pairs are counted as it
// counts them: an empty one between two '&' is one.
const maxQueryParams = 10000

// knownQuery refuses a query parameter the route does not take, and one
// given more than once, as unknown body fields are refused (API.md §0).
// QA: GET /effects?status=indeterminate, a typo of state, listed every
// effect, and ?state=a&state=b filtered by the first. A path parameter may
// come as a query parameter holding the path's own value: Vercel's
// rewrites pass them so (ServeRoute), and any other value names something
// else. Public routes (health, discovery) take any: a cache-busting
// parameter there asks for nothing.
func knownQuery(r *http.Request, route *Route) error {
	if r.URL.RawQuery == "" {
		return nil // nothing to refuse, as nearly every request that is not a list
	}
	if name, ok := undecodableQuery(r.URL.RawQuery); ok {
		if slices.Contains(route.PathParams(), name) && isIDParam(name) && r.PathValue(name) == name {
			// A path id Vercel's rewrite put in the query (ServeRoute; the
			// function's path holds the parameter's name in its place): it
			// names nothing, as the same path served locally says. Beside
			// a path that holds the id, it is a bad query (review).
			return apierr.NotFound(pathResource(route.Pattern, name))
		}
		return apierr.InvalidField(name, "must be percent-encoded (%% and two hex digits) in a query of name=value pairs joined by &")
	}
	if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
		// Every pair decodes, so it is the count: net/url reads no query
		// of more than maxQueryParams parameters, and URL.Query answers it
		// empty, every filter and every unknown name left out unseen
		// (edge QA: ?state=bogus and 10 000 more listed every effect, and
		// a begin with them acted).
		return apierr.InvalidField("query", "must hold at most %d parameters", maxQueryParams)
	}
	var p apierr.Problems
	pathParams := route.PathParams()
	for name, values := range r.URL.Query() {
		isPath := slices.Contains(pathParams, name)
		i := slices.IndexFunc(route.Query, func(q Param) bool { return q.Name == name })
		switch {
		case !isPath && i < 0:
			p.Add(strings.ToValidUTF8(name, "\uFFFD"), "is not a query parameter of this route")
		case len(values) > 1:
			p.Add(name, "must be given once")
		case isPath && values[0] != r.PathValue(name):
			p.Add(name, "is the path's own parameter: leave it out of the query")
		case i >= 0 && values[0] == "" && (route.Query[i].Enum != nil || route.Query[i].Pattern != ""):
			// A filter given empty filters nothing: the list read it as
			// not given and answered every row (QA: ?state= listed every
			// effect, every run, every approval, where the client asked
			// for a state it left blank; the MCP tools refused it
			// themselves). Its values (Enum) and form (Pattern) hold no
			// empty one, as the OpenAPI document says.
			p.Add(name, "must not be empty: leave it out to list every row")
		case i >= 0:
			if rule, bad := refusedValue(route, route.Query[i], values[0]); bad {
				p.Add(name, "%s", rule)
			}
		}
	}
	slices.SortFunc(p, func(a, b apierr.FieldError) int { return strings.Compare(a.Field, b.Field) })
	return p.Err()
}

// refusedValue says whether v is not a value of the route's query
// parameter q, and what it must be. Every declared parameter is checked
// here, in one place for every route, so that one answer names each
// parameter at fault (QA: ?outcome=RUNNING&cursor=bad named outcome only,
// each list refusing its filters, limit and cursor one at a time), as a
// body's validation names each field.
func refusedValue(route *Route, q Param, v string) (string, bool) {
	rule := func(generated string) (string, bool) {
		if q.Rule != "" {
			return q.Rule, true
		}
		return generated, true
	}
	switch {
	case q.Name == "cursor":
		if v != "" && (len(v) > maxCursorBytes || (route.Cursor != nil && !route.Cursor(v))) {
			return "is not a cursor from this API", true
		}
	case q.Type == "integer":
		n, err := strconv.Atoi(v)
		if err != nil || (q.Min != nil && n < *q.Min) || (q.Max != nil && n > *q.Max) {
			if q.Min != nil && q.Max != nil {
				return rule(fmt.Sprintf("must be an integer from %d to %d", *q.Min, *q.Max))
			}
			return rule("must be an integer")
		}
	case q.Type == "boolean":
		if v != "true" && v != "false" {
			return rule("must be true or false")
		}
	case q.Enum != nil && !slices.Contains(q.Enum, v):
		return rule("must be " + orList(q.Enum))
	case q.Valid != nil && !q.Valid(v):
		return rule("is not valid")
	}
	return "", false
}

// orList joins values as "A, B or C".
func orList(values []string) string {
	if len(values) < 2 {
		return strings.Join(values, "")
	}
	return strings.Join(values[:len(values)-1], ", ") + " or " + values[len(values)-1]
}

// authorize checks the route's credentials and sets c.Principal for a key,
// counting the request against the key's rate limit when count is set.
func (s *Server) authorize(ctx context.Context, c *Call, count bool) error {
	switch c.Route.Auth {
	case AuthKey:
		secret, ok := bearer(c.R)
		if !ok {
			return apierr.Unauthorized("Missing, malformed, or revoked key.")
		}
		verify := s.Auth.Authenticate
		switch {
		case !count:
			verify = s.Auth.Verify
		case c.Route.Settles:
			verify = s.Auth.AuthenticateSettling
		case c.Route.checksKeyAsItWrites():
			verify = s.Auth.AuthenticateUncached
		}
		p, err := verify(ctx, secret)
		if err != nil {
			if lostDatabase(err) {
				// The route never ran: what the key's look-up sent (its
				// rate counter at most) is not the request's action, which
				// was not applied (chaos QA: answered outcome unknown).
				return notApplied(ctx, err)
			}
			return err
		}
		if err := p.Require(c.Route.Scopes...); err != nil {
			return err
		}
		if a := c.Route.AnyScopes; len(a) > 0 && !slices.ContainsFunc(a, p.Has) {
			return apierr.ForbiddenAnyOf(a...)
		}
		c.Principal = p
	case AuthCron:
		secret, ok := bearer(c.R)
		want := s.Config.CronBearer() // trimmed, as the credential is
		if want == "" {
			s.logCronUnset(c)
		}
		if !ok || want == "" || !auth.SharedSecretEqual(secret, want) {
			return apierr.Unauthorized("The cron route needs Authorization: Bearer $CRON_SECRET.")
		}
	}
	return nil
}

// vercelCron begins the User-Agent of the calls Vercel's cron makes
// (vercel-cron/1.0).
const vercelCron = "vercel-cron/"

// logCronUnset says, where an operator looks, that c, a call of the cron
// route, is refused for want of CRON_SECRET. Vercel's schedule (its
// User-Agent, vercelCron) is the only sweeper there, and nothing else tells
// that it never runs: an error. Any other caller's is a warning: on Lambda
// the sweeper function sweeps without the route (the template leaves
// CRON_SECRET unset), and a call on the public Function URL, someone's
// probe, logged an error that said the sweep was refused (AL review). Each
// once per instance: the route is public, and a line per call let anyone
// fill the log (deploy review).
func (s *Server) logCronUnset(c *Call) {
	if strings.HasPrefix(c.R.Header.Get("User-Agent"), vercelCron) {
		if s.cronUnsetLogged.CompareAndSwap(false, true) {
			s.Logger.Error("cron sweep refused: CRON_SECRET is not set, so Vercel's schedule never sweeps",
				"request_id", c.RequestID)
		}
		return
	}
	if s.cronUnsetWarned.CompareAndSwap(false, true) {
		s.Logger.Warn("cron sweep refused: CRON_SECRET is not set (a sweep through this route needs it: "+
			"Vercel's schedule, or one by hand)", "request_id", c.RequestID)
	}
}

func bearer(r *http.Request) (string, bool) {
	if len(r.Header.Values("Authorization")) != 1 {
		// Two credentials name no one caller: a proxy and a client each
		// may read a different one (fuzz QA: only the first was used).
		return "", false
	}
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func internalError(reqID string) *apierr.Error {
	return apierr.Internal(nil).WithDetail("request_id", reqID)
}

// unreadableValue is the 500 of a request that had to use a stored value
// sealed with a key this instance is not configured with (a duplicate's
// result, a compensation an unwind plans, a job input a claim hands over,
// the answer kept for an Idempotency-Key): what it would do without the
// value is wrong, so it is refused, changing nothing. Reads answer such a
// value null with <field>Unreadable / <field>_unreadable instead. The
// message says it is the operator's to mend, and that the same request
// sent again then succeeds (as it may at once through an instance that has
// the key, mid-deploy): under the same Idempotency-Key, whose first request
// may have acted. The detail is the request id alone, as every 500's.
func unreadableValue(reqID string) *apierr.Error {
	return apierr.New(http.StatusInternalServerError, apierr.CodeInternal,
		"A stored value this request needs is encrypted with a key this server is not configured with, so it was "+
			"refused and changed nothing. The operator must configure that key again (the server log names it); "+
			"then send the request again as it was (under the same Idempotency-Key, if it had one).").
		WithDetail("request_id", reqID)
}

// fail writes err as the envelope. Anything that is not an *apierr.Error is
// logged (as redact.ErrorText has it: a driver error's message can quote a
// value, a data exception's does) and answered as a bare internal_error,
// or, for a stored value this instance cannot open, as one that says so
// (unreadableValue).
func (s *Server) fail(ctx context.Context, w http.ResponseWriter, reqID string, route *Route, err error) {
	if e, ok := apierr.As(err); ok && e.Code != apierr.CodeInternal && e.Code != apierr.CodeDatabaseUnavailable {
		writeError(w, e)
		return
	}
	if errors.Is(context.Cause(ctx), context.Canceled) || errors.Is(err, context.Canceled) {
		// The client went away. Decided by the request's context, not the
		// error: a statement cancelled for it answers the server's
		// "canceling statement" (57014), which reads as an outage.
		writeError(w, apierr.ClientClosed())
		return
	}
	if lostDatabase(err) {
		unavailable, ok := apierr.As(err)
		if !ok || unavailable.Code != apierr.CodeDatabaseUnavailable {
			// Say "nothing was changed" only when nothing was sent: a
			// statement in flight when the connection failed, or when the
			// request's time ran out, may have committed.
			unavailable = databaseFailure(ctx, err, !db.Unapplied(err))
		}
		s.Logger.Warn("database unavailable", "request_id", reqID, "route", route.Name,
			"outcome", unavailable.Detail["outcome"], "err", err)
		writeError(w, unavailable.WithDetail("request_id", reqID))
		return
	}
	// Logged as every 500 is (err names the row and the key id of a value
	// that cannot be opened, never the value).
	s.Logger.Error("internal error", "request_id", reqID, "route", route.Name, "err", err)
	if errors.Is(err, seal.ErrUnknownKey) {
		writeError(w, unreadableValue(reqID))
		return
	}
	writeError(w, internalError(reqID))
}

// panicValue is how a recovered panic's value is logged: a runtime error
// as it is (it names indexes and types, no data), anything else by its
// type only: a panic's string, value or error may have been built from the
// request's data (QA: a panic with errors.New of a value the request held
// logged the value; redact.ErrorText withholds only the parts it knows to
// quote one), and the stack logged beside it says where it was raised.
func panicValue(p any) any {
	if err, ok := p.(runtime.Error); ok {
		return err
	}
	return fmt.Sprintf("a %T, its value withheld from logs", p)
}

// loggedMethod is how a request's method is logged: an HTTP method as it
// is, anything else as "other" (security QA: a method is any token the
// client likes, logged before authentication, and a 200 kB one made a 200 kB
// log line).
func loggedMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
