package ratchet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Version is this SDK's version, sent in the User-Agent header.
const Version = "0.4.13"

// DefaultBaseURL is the hosted service.
const DefaultBaseURL = "https://getratchet.app"

// Config configures a Client.
type Config struct {
	// BaseURL is the service's origin, e.g. "http://localhost:8787" for
	// scripts/dev. A trailing "/api/v1" is accepted. Empty means
	// DefaultBaseURL, the hosted service: set it for your own deployment
	// (or scripts/dev), or the key is sent to the hosted service instead.
	BaseURL string
	// APIKey is the bearer secret. Read it from the environment or a secret
	// store; never commit it. Producers use an INGEST key, workers a WORKER
	// key listing their exact name@version pairs, agents an AGENT key.
	APIKey string
	// HTTPClient sends the requests. Nil means a client with a 60 second
	// timeout (long enough for a claim's waitSeconds) that keeps up to 64
	// idle connections to the API (see defaultHTTPClient). Replace it to add
	// proxies, tracing or test transports.
	HTTPClient *http.Client
	// MaxRetries bounds how often one call is repeated after a retryable
	// failure (429, 5xx, network error, retry_request). Zero means 3;
	// negative disables retries. A call sent under an Idempotency-Key
	// (RegisterWorker, Replay, CreateKey, CreateWebhook, PublishContract,
	// TestTool, CreateGroupWithKey) also waits, outside this bound, while the server
	// holds its key for an earlier attempt (up to 40 times); negative
	// disables that too.
	MaxRetries int
	// UserAgent is prepended to the SDK's own User-Agent.
	UserAgent string
}

// String describes cfg with its APIKey masked, so that printing a Config
// (%v, %+v, a startup log of the settings) never writes the secret; GoString
// (%#v) and LogValue (log/slog, JSON handlers too) do the same.
func (cfg Config) String() string {
	return fmt.Sprintf("ratchet.Config{BaseURL: %q, APIKey: %s, HTTPClient: %s, MaxRetries: %d, UserAgent: %q}",
		withoutUserinfo(cfg.BaseURL), maskedKey(cfg.APIKey), customOrDefault(cfg.HTTPClient != nil), cfg.MaxRetries, cfg.UserAgent)
}

// GoString is String, for %#v.
func (cfg Config) GoString() string { return cfg.String() }

// LogValue is cfg for log/slog, its APIKey masked.
func (cfg Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("base_url", withoutUserinfo(cfg.BaseURL)), slog.String("api_key", maskedKey(cfg.APIKey)),
		slog.Bool("custom_http_client", cfg.HTTPClient != nil), slog.Int("max_retries", cfg.MaxRetries),
		slog.String("user_agent", cfg.UserAgent))
}

// withoutUserinfo is a base URL as printed: without the user and password
// of one that holds them (https://user:pass@host, which NewClient refuses:
// the API key is the credential), so that printing a Config, or NewClient's
// refusal, never writes them.
func withoutUserinfo(base string) string {
	u, err := url.Parse(base)
	if err != nil {
		if strings.Contains(base, "@") {
			return "(a URL that does not parse)"
		}
		return base
	}
	if u.User == nil {
		return base
	}
	u.User = nil
	return u.String()
}

// errKeyUnsendable refuses a key no HTTP header can carry; it never holds
// the key.
var errKeyUnsendable = errors.New("ratchet: the API key holds a line break, a control character or a character " +
	"beyond ASCII, which no key holds and no Authorization header can carry (read it without its line end)")

// errHeaderUnsendable refuses an Idempotency-Key or a User-Agent no HTTP
// header can carry, before anything is sent; it never holds the value.
func errHeaderUnsendable(header string) error {
	return fmt.Errorf("ratchet: the %s holds a line break, a control character or a character beyond ASCII, "+
		"which no header can carry", header)
}

// errDotSegment refuses an id or a name of "." or "..": a URL resolves it as
// a path step, so the call would reach another route (GET /runs/.. is GET
// /api/v1), as the Python and TypeScript SDKs refuse it.
var errDotSegment = errors.New(`ratchet: an id or a name of "." or ".." cannot be sent: ` +
	"a URL reads it as a path step, calling another route")

// dotSegment says whether path (its query aside) has a "." or ".." step.
func dotSegment(path string) bool {
	path, _, _ = strings.Cut(path, "?")
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// sendableKey says whether key is printable ASCII (spaces and tabs
// allowed: the server trims them around it), the only characters a key
// has, as the Python and TypeScript SDKs check it; an Idempotency-Key and
// a User-Agent are held to the same.
func sendableKey(key string) bool {
	for i := 0; i < len(key); i++ {
		if b := key[i]; b != '\t' && (b < 0x20 || b > 0x7e) {
			return false
		}
	}
	return true
}

// maskedKey stands for an API key in printed values: whether one is set,
// never any part of it.
func maskedKey(key string) string {
	if key == "" {
		return `""`
	}
	return "[redacted]"
}

func customOrDefault(custom bool) string {
	if custom {
		return "custom"
	}
	return "default"
}

// Client calls the Ratchet API. It is safe for concurrent use.
//
// Retries: a 429 is repeated after the server's retry_after_seconds (or
// Retry-After, up to a minute) and up to a fifth of it more, drawn at random
// so that clients refused together do not all come back at once, a 409 retry_request at once, a 503 database_unavailable that
// changed nothing with backoff, and one whose outcome is unknown, other 5xx
// responses (a 503's Retry-After heeded up to 8 s, and up to a fifth of it
// more, drawn at random, as a 429's) and lost answers (network
// errors, the HTTP client's Timeout) with capped exponential backoff and
// jitter, but only for calls that are idempotent (every effect-gate and job
// call is, by idempotency key, Idempotency-Key header or lease token;
// UpdateEndpointPolicy is not, whose repeat would meet the version the first
// wrote, so it is never repeated after an ambiguous failure; StartRun,
// CreateGroup and UpdateEffectPolicy are repeated under an Idempotency-Key
// of their own, answered the first answer). Every wait ends with ctx.
type Client struct {
	base       string
	key        string
	hc         *http.Client
	maxRetries int
	ua         string

	// Test seams: how to wait and how to draw jitter.
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func() float64
}

// String describes c by its API origin, never its key: %v or %+v of a
// *Client printed every field, the bearer secret included. GoString is the
// same, for %#v.
func (c *Client) String() string { return "ratchet.Client{" + withoutUserinfo(c.base) + "}" }

// GoString is String, for %#v.
func (c *Client) GoString() string { return c.String() }

// NewClient returns a Client for cfg. It fails when the base URL does not
// parse, or the key is empty or holds a character no key has (a line break,
// another control character, one beyond ASCII: no header can carry it).
func NewClient(cfg Config) (*Client, error) {
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = DefaultBaseURL
	}
	base = strings.TrimSuffix(base, "/api/v1")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("ratchet: base URL %q is not an http(s) origin", withoutUserinfo(cfg.BaseURL))
	}
	if u.User != nil {
		// Refused, as the TypeScript and Python SDKs refuse it: the API key
		// is the credential, and a user and password the client would not
		// send (Bearer wins) left a reader of the setting thinking they
		// were. The message leaves them out.
		return nil, fmt.Errorf("ratchet: base URL %q must not hold credentials (user:password@); the API key is the credential",
			withoutUserinfo(cfg.BaseURL))
	}
	if strings.TrimSpace(cfg.APIKey) == "" {
		return nil, errors.New("ratchet: an API key is required (read it from the environment)")
	}
	if !sendableKey(cfg.APIKey) {
		// Never sent: each call failed as a network error (net/http
		// refuses the header), repeated, a worker's registration for ever.
		return nil, errKeyUnsendable
	}
	if !sendableKey(cfg.UserAgent) {
		// Refused as the key is: net/http refused the header at each
		// call, a network error repeated.
		return nil, errHeaderUnsendable("user agent")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = defaultHTTPClient()
	}
	retries := cfg.MaxRetries
	switch {
	case retries == 0:
		retries = 3
	case retries < 0:
		retries = 0
	}
	ua := "ratchet-go/" + Version
	if cfg.UserAgent != "" {
		ua = cfg.UserAgent + " " + ua
	}
	return &Client{base: base + "/api/v1", key: cfg.APIKey, hc: hc, maxRetries: retries, ua: ua,
		sleep: sleepCtx, jitter: rand.Float64}, nil
}

// sleepCtx waits d or until ctx ends, or until the channel of
// withRetryCutoff closes.
func sleepCtx(ctx context.Context, d time.Duration) error {
	cutoff, _ := ctx.Value(retryCutoffKey{}).(<-chan struct{})
	if d <= 0 {
		// No wait (a begin's retry_request), but once cut off no new try
		// either: DoEffect's begins run under a cutoff at its ctx's end.
		select {
		case <-cutoff:
			return errRetryCutoff
		default:
			return ctx.Err()
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-cutoff:
		return errRetryCutoff
	case <-t.C:
		return nil
	}
}

type retryCutoffKey struct{}

var errRetryCutoff = errors.New("ratchet: retry wait cut off")

// errNotAnObject is a 2xx answer that is not a JSON object.
var errNotAnObject = errors.New("not a JSON object")

// withRetryCutoff returns ctx whose retry waits (a 429's Retry-After, a
// backoff) end early once cutoff closes, while a request already sent runs
// to its answer: a stopping worker does not wait out a rate limit to claim
// work it will not run, yet never abandons a claim the server may have
// made.
func withRetryCutoff(ctx context.Context, cutoff <-chan struct{}) context.Context {
	return context.WithValue(ctx, retryCutoffKey{}, cutoff)
}

type singleTryKey struct{}

// singleTry returns ctx under which a call is sent once and its failure
// returned at once, whatever Config.MaxRetries: for a worker's heartbeat,
// which paces its own next try within the lease left (heartbeatWait), as
// the Python and TypeScript workers' do (sdk QA: the client's 0.5-8 s
// backoff and a 429's whole Retry-After were waited inside the call).
func singleTry(ctx context.Context) context.Context {
	return context.WithValue(ctx, singleTryKey{}, true)
}

// idempotency says whether a call may be repeated after an ambiguous
// failure (a 5xx or a network error), where the server may have acted.
type idempotency bool

const (
	idempotent    idempotency = true
	notIdempotent idempotency = false
)

// outcomeNotApplied is a database_unavailable's detail.outcome when the
// call certainly changed nothing; anything else ("unknown", or none) may
// have been applied.
const outcomeNotApplied = "not_applied"

// maxRateLimitWaitSeconds bounds the wait a 429 asks for: the API's rate
// limits count per minute.
const maxRateLimitWaitSeconds = 60

// retryAfterSpread bounds how much a 429's or a 503's Retry-After is
// lengthened at random, as a divisor of the wait the server asked for: up
// to a fifth more (12 s on a whole minute, 0.2 s on one second). The
// limiter counts fixed one-minute windows and tells every client it refused
// in one to come back at that window's end: waiting exactly that long
// brought them all back at the same instant, where the first few spent the
// new window's allowance and the rest were refused again (sdk QA); a 503's
// (a proxy's maintenance page, a host shedding load) told every client it
// turned away the same instant too, and was waited exactly. A spread in
// proportion to the wait, as gRPC's backoff jitter is, scatters a herd
// refused early in a window over a fifth of the next one; a few seconds'
// wait is lengthened by less than a second. The Python and TypeScript SDKs
// spread theirs the same.
const retryAfterSpread = 5

// retryAfterWait is the wait after a 429 or a 503 that asked for d: never
// less than d, and up to a fifth more, drawn by jitter (in [0, 1)).
func retryAfterWait(d time.Duration, jitter func() float64) time.Duration {
	return d + time.Duration(jitter()*float64(d/retryAfterSpread))
}

// Backoff bounds for 5xx and network errors.
const (
	backoffBase = 500 * time.Millisecond
	backoffCap  = 8 * time.Second
)

// do sends one API call, repeating it as the retry rules allow, and decodes
// a 2xx body into out (when out is non-nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any, safe idempotency) error {
	return c.doKeyed(ctx, method, path, "", in, out, safe)
}

// RequestOptions shape Request.
type RequestOptions struct {
	// Safe lets the call be repeated after a lost answer or a 5xx: only
	// for a call whose repeat changes nothing more (a read, a change keyed
	// by the request itself).
	Safe bool
	// IdempotencyKey, when set, is sent as every attempt's Idempotency-Key:
	// the routes marked so in the OpenAPI document keep their answer a day
	// under it, so such a call is safe to repeat (set Safe too); other
	// routes ignore the header.
	IdempotencyKey string
}

// Request calls any route, its path written under /api/v1
// ("/effects?state=indeterminate"; "/api/v1/effects" would be
// /api/v1/api/v1/effects, 404 not_found), with the client's key, retries
// and errors, as the Python and TypeScript SDKs' request: body (nil for
// none) is sent as JSON and a 2xx answer decoded into out (nil discards
// it). A failure is an *Error as any call's. The key must hold the route's
// scope (/llms.txt lists each route's).
func (c *Client) Request(ctx context.Context, method, path string, body, out any, opts RequestOptions) error {
	return c.doKeyed(ctx, method, path, opts.IdempotencyKey, body, out, idempotency(opts.Safe))
}

// IdempotencyKeyHeader is the header under which the server keeps a
// create's answer and gives it again to the same request (API routes marked
// so in its OpenAPI document).
const IdempotencyKeyHeader = "Idempotency-Key"

// maxKeyedPolls bounds the waits of a keyed call for its key's first
// request: the server holds a key at most 30 seconds and asks for pauses of
// 1 to 5 seconds.
const maxKeyedPolls = 40

// doKeyed is do sending key (when not empty) as every attempt's
// Idempotency-Key, so that the server answers a repeat of a create that
// acted with what it answered then instead of acting again.
func (c *Client) doKeyed(ctx context.Context, method, path, key string, in, out any, safe idempotency) error {
	// Refused before sending: net/http refused such a key at each attempt,
	// a network error repeated, and a ".." id reached another route.
	if !sendableKey(key) {
		return errHeaderUnsendable(IdempotencyKeyHeader)
	}
	if dotSegment(path) {
		return errDotSegment
	}
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("ratchet: encode request: %w", err)
		}
		body = b
	}
	polls := 0
	unsure := false // an attempt may have been applied though it failed
	for attempt := 0; ; attempt++ {
		err := c.once(ctx, method, path, key, body, out)
		if err == nil {
			return nil
		}
		unsure = unsure || mayHaveApplied(err)
		err = unconfirmedIf(unsure, err)
		wait, retry := c.retryDelay(err, attempt, safe)
		if key != "" && IsCode(err, CodeRetryRequest) && polls < maxKeyedPolls && c.maxRetries > 0 &&
			ctx.Err() == nil {
			// The key's first request (ours, whose answer was lost) is
			// still acting, or died and holds the key until its claim
			// lapses: waiting for it is not a retry of this call.
			polls++
			attempt--
			wait = max(wait, time.Second)
		} else if !retry || attempt >= c.maxRetries || ctx.Err() != nil || ctx.Value(singleTryKey{}) != nil {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return err // waiting would outlive the caller; give them the real answer now
		}
		if c.sleep(ctx, wait) != nil {
			return err
		}
	}
}

// unconfirmed is a call's error when an earlier attempt of it failed in a
// way that may have been applied (its answer lost, a 5xx) and the last was
// turned away: the last error says only why the retries stopped (QA: a
// report whose answer was lost, retried into a 409, read as "refused").
type unconfirmed struct{ err error }

func (e *unconfirmed) Error() string { return e.err.Error() }
func (e *unconfirmed) Unwrap() error { return e.err }

// unconfirmedIf is err, marked unconfirmed when unsure (an earlier attempt
// may have been applied) and err does not say so itself.
func unconfirmedIf(unsure bool, err error) error {
	if unsure && !mayHaveApplied(err) {
		return &unconfirmed{err: err}
	}
	return err
}

// mayHaveApplied says whether a call that failed with err may have been
// applied: an attempt's answer was lost (a network failure, its time ran
// out) or the server failed after acting (a 5xx, but a database_unavailable
// that says nothing was applied).
func mayHaveApplied(err error) bool {
	var u *unconfirmed
	if errors.As(err, &u) {
		return true
	}
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode >= 500 &&
			!(apiErr.Code == CodeDatabaseUnavailable && apiErr.Detail["outcome"] == outcomeNotApplied)
	}
	return !errors.Is(err, context.Canceled)
}

// retryDelay decides whether err (after attempt retries so far) is worth
// repeating and after how long.
func (c *Client) retryDelay(err error, attempt int, safe idempotency) (time.Duration, bool) {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.StatusCode == http.StatusTooManyRequests:
			// The limiter refused before acting, so any call may repeat.
			// Its windows are a minute long; a longer wait (a proxy's) is
			// cut to that, so a heartbeat does not sleep its lease away and
			// a huge header cannot overflow into no wait at all (review).
			secs := min(max(apiErr.RetryAfterSeconds(), 1), maxRateLimitWaitSeconds)
			return retryAfterWait(time.Duration(secs)*time.Second, c.jitter), true
		case apiErr.Code == CodeRetryRequest:
			// At once after a lost race (begin); after the pause the server
			// asks for while the first request under an Idempotency-Key is
			// still acting.
			return time.Duration(max(apiErr.RetryAfterSeconds(), 0)) * time.Second, true
		case apiErr.Code == CodeDatabaseUnavailable && apiErr.Detail["outcome"] == outcomeNotApplied,
			apiErr.Code == CodeRequestTimeout:
			// The server says nothing was changed (a body that arrived too
			// late was never acted on), so any call may repeat.
			return c.backoff(attempt), true
		case apiErr.Code == CodeDatabaseUnavailable:
			// The database failed after the call was sent (or the server
			// does not say): it may have been applied, so repeat only what
			// a key or token makes safe.
			return c.backoff(attempt), bool(safe)
		case apiErr.StatusCode == http.StatusServiceUnavailable:
			// A Retry-After on a 503 (a proxy's, or a host's shedding
			// load) is the earliest the server wants to see us again, up
			// to the backoff's cap: a heartbeat or a report that slept a
			// maintenance page's two minutes would let its lease lapse
			// (review). It is then spread as a 429's is.
			wait := min(time.Duration(apiErr.RetryAfterSeconds())*time.Second, backoffCap)
			return max(c.backoff(attempt), retryAfterWait(wait, c.jitter)), bool(safe)
		case apiErr.StatusCode >= 500:
			return c.backoff(attempt), bool(safe)
		}
		return 0, false
	}
	// A transport failure (once answers the caller's ctx.Err() instead
	// when its context ended) is a lost answer even when it matches
	// context.DeadlineExceeded, as an http.Client Timeout's does (QA: a
	// begin whose answer took longer than the client's timeout was never
	// asked again, and its key ended indeterminate).
	var ne *netError
	var ua *unreadableAnswer
	if errors.As(err, &ne) || errors.As(err, &ua) {
		// A call safe to repeat is asked again for its answer (a report
		// counted lost because its answer was unreadable made Stop say
		// reports were not recorded, though they were).
		return c.backoff(attempt), bool(safe)
	}
	return 0, false // the caller's context ended, or an error of ours
}

// backoff is capped exponential backoff with "equal jitter": half the step
// is fixed, half random, so waits never collapse to zero.
func (c *Client) backoff(attempt int) time.Duration {
	d := backoffBase << min(attempt, 10)
	if d > backoffCap {
		d = backoffCap
	}
	return d/2 + time.Duration(c.jitter()*float64(d/2))
}

// unreadableAnswer marks a 2xx whose body could not be decoded: the call
// was applied, and its answer lost as surely as by a dropped connection.
type unreadableAnswer struct {
	err  error
	call callInfo // the call it answered, for the default failure log
}

func (e *unreadableAnswer) Error() string { return e.err.Error() }
func (e *unreadableAnswer) Unwrap() error { return e.err }

// netError marks a transport failure (the request may or may not have
// reached the server), and the call it failed on.
type netError struct {
	err  error
	call callInfo
}

// Error implements error.
func (e *netError) Error() string { return "ratchet: " + e.err.Error() }

// Unwrap returns the transport's error.
func (e *netError) Unwrap() error { return e.err }

// once sends a single request, under idempotency key key when not empty.
func (c *Client) once(ctx context.Context, method, path, key string, body []byte, out any) error {
	var rdr io.Reader
	if body != nil {
		rdr = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rdr)
	if err != nil {
		return fmt.Errorf("ratchet: build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.ua)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(IdempotencyKeyHeader, key)
	}
	call := callOf(method, req.URL)
	res, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &netError{err: err, call: call}
	}
	defer res.Body.Close()
	// Bound what we read: API responses are small, and an error page from a
	// proxy must not exhaust memory.
	raw, err := io.ReadAll(io.LimitReader(res.Body, 32<<20))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &netError{err: err, call: call}
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		e := decodeError(res, raw)
		e.call = call
		return e
	}
	if out == nil {
		return nil
	}
	// A repeat after an unreadable answer decodes into a clean value, not
	// over what the unreadable one half filled in.
	checked, isChecked := out.(checkedAnswer)
	if isChecked {
		checked.reset()
	} else if v := reflect.ValueOf(out); v.Kind() == reflect.Pointer && !v.IsNil() {
		v.Elem().SetZero()
	}
	if body := bytes.TrimSpace(raw); len(body) == 0 || body[0] != '{' {
		// Every route answers an object: an empty 2xx (a proxy's, or a
		// head cut after its status line) or another JSON value is an
		// answer lost, as the Python and TypeScript SDKs read it; it was
		// decoded as the zero answer (a claim of no jobs, whose jobs were
		// left leased to nobody).
		err = errNotAnObject
	} else {
		err = json.Unmarshal(raw, out)
	}
	if deep, ok := out.(deepAnswer); ok && tooDeep(err) {
		// A value the server took at its body's depth, carried deeper by
		// the answer around it: read by its parts.
		err = deep.unmarshalDeep(raw)
	}
	if isChecked && err == nil {
		err = checked.check(res.Header)
	}
	if err != nil {
		// The server acted and answered; only its answer is unreadable
		// (cut short by a proxy, say).
		return &unconfirmed{err: &unreadableAnswer{err: fmt.Errorf("ratchet: decode %s %s response: %w", method, path, err),
			call: call}}
	}
	if sd, ok := out.(serverDated); ok {
		if d, err := http.ParseTime(res.Header.Get("Date")); err == nil {
			sd.setServerDate(d)
		}
	}
	return nil
}

// checkedAnswer is a response read against the request it answers: reset
// clears what an earlier attempt's answer filled in (keeping the request's
// side), and check, given the response's header, keeps what it needs of it
// or answers why the decoded answer is unreadable, repeated as one (a batch
// report's results naming other jobs).
type checkedAnswer interface {
	reset()
	check(http.Header) error
}

// serverDated is a response that keeps the server's Date header: the
// server's clock when it answered, to whole seconds. A lease's length is its
// expiry minus that, which holds whatever our own clock says.
type serverDated interface{ setServerDate(time.Time) }

// decodeError turns a non-2xx response into *Error.
func decodeError(res *http.Response, raw []byte) *Error {
	e := &Error{StatusCode: res.StatusCode, RequestID: res.Header.Get("X-Request-Id"), body: raw}
	var env struct {
		Error *struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Detail  map[string]any `json:"detail"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &env) == nil && env.Error != nil {
		e.Code, e.Message, e.Detail = env.Error.Code, env.Error.Message, env.Error.Detail
	} else {
		e.Message = http.StatusText(res.StatusCode)
	}
	limited := res.StatusCode == http.StatusTooManyRequests || res.StatusCode == http.StatusServiceUnavailable
	if limited && e.RetryAfterSeconds() == 0 {
		// An HTTP date is measured against the server's own clock (its
		// Date header) when it sent one, as lease lengths are.
		now := time.Now()
		if d, err := http.ParseTime(res.Header.Get("Date")); err == nil {
			now = d
		}
		if s := retryAfterHeader(res.Header.Get("Retry-After"), now); s > 0 {
			if e.Detail == nil {
				e.Detail = map[string]any{}
			}
			e.Detail["retry_after_seconds"] = float64(s)
		}
	}
	return e
}

// retryAfterHeader reads a Retry-After header in whole seconds from now:
// delay-seconds or an HTTP date (RFC 9110 §10.2.3); 0 when it is absent,
// unreadable or already past.
func retryAfterHeader(v string, now time.Time) int {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		return max(s, 0)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(int(math.Ceil(t.Sub(now).Seconds())), 0)
	}
	return 0
}

// pathID escapes an id, a tool name or an effect type for use as one path
// segment: every byte but RFC 3986's unreserved ones (letters, digits,
// - . _ ~) is percent-encoded. url.PathEscape leaves + & = ; : as they are,
// which a path may hold, but a proxy that copies the segment into a query
// (Vercel's rewrites: ?name=:name) splits it at & and reads + as a space.
func pathID(id string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := range len(id) {
		c := id[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// withQuery is path with v as its query, when v has any.
func withQuery(path string, v url.Values) string {
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

// idleConnsPerHost is how many idle connections the default client keeps to
// the API: more than a worker's claim, report batches and heartbeats, or a
// producer's goroutines, need at once.
const idleConnsPerHost = 64

// defaultHTTPClient is http.DefaultTransport's settings (proxy from the
// environment, dial and TLS timeouts, HTTP/2) with idleConnsPerHost idle
// connections kept per host instead of its 2. With 2, every request beyond
// the second in flight at once opened a new connection, and over HTTPS did
// a new TLS handshake: a worker at concurrency 100 (a claim, up to three
// report batches and heartbeats at once) or a producer enqueuing from many
// goroutines paid that on most requests.
func defaultHTTPClient() *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: keepAlive(http.DefaultTransport)}
}

// keepAlive returns a copy of base keeping idleConnsPerHost idle connections
// per host (and at least as many in all), or base itself when it is not an
// *http.Transport (a program that replaced http.DefaultTransport chose its
// own).
func keepAlive(base http.RoundTripper) http.RoundTripper {
	t, ok := base.(*http.Transport)
	if !ok {
		return base
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = idleConnsPerHost
	if t.MaxIdleConns != 0 && t.MaxIdleConns < idleConnsPerHost {
		t.MaxIdleConns = idleConnsPerHost
	}
	return t
}

// transient says whether err, a call's failure, may pass: what the client
// repeats for a call that is safe to repeat (a lost answer, a 5xx, a 429, a
// 408, a retry_request), once its retries ran out. A refusal (4xx) is not,
// nor is the end of the caller's context.
func (c *Client) transient(err error) bool {
	_, retry := c.retryDelay(err, 0, idempotent)
	return retry
}
