// Package mcpserver exposes the effect gate to MCP clients (Claude Code,
// Claude Desktop, Cursor, any MCP client) as nine tools. Every tool is one
// REST call made through a Caller — in-process through the same router for
// the streamable-HTTP endpoint, or over HTTP for the stdio binary — so
// authentication, scopes, validation and error codes are exactly the REST
// API's, written once.
package mcpserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Version is reported to MCP clients.
const Version = "1.0.0"

// Caller performs one REST call on behalf of an MCP client.
type Caller interface {
	Call(ctx context.Context, method, path, authorization string, body []byte) (status int, resp []byte, err error)
}

// HandlerCaller serves calls in-process through the REST router.
type HandlerCaller struct{ Handler http.Handler }

// Call implements Caller.
func (c HandlerCaller) Call(ctx context.Context, method, path, authorization string, body []byte) (int, []byte, error) {
	req := httptest.NewRequest(method, path, bytes.NewReader(body)).WithContext(ctx)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	c.Handler.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes(), nil
}

// HTTPCaller sends calls to a Ratchet server (the stdio binary's mode).
type HTTPCaller struct {
	BaseURL string
	Client  *http.Client
}

// Call implements Caller.
func (c HTTPCaller) Call(ctx context.Context, method, path, authorization string, body []byte) (int, []byte, error) {
	if method == http.MethodPost && path == beginPath {
		// A begin abandoned in flight may have been granted, its lease
		// token then reaching no one: the key answered in_flight until
		// the lease lapsed, then blocked (MCP QA: a client cancelled a
		// ratchet_begin). Its request cancelled, it finishes within
		// CancelGrace, and the stdio binary gives back a lease nobody
		// will see (ReleaseUnseen). One cancelled before it is sent is
		// not sent.
		if err := ctx.Err(); err != nil {
			return 0, nil, fmt.Errorf("call %s %s: not sent: %w", method, path, err)
		}
		var stop context.CancelFunc
		ctx, stop = finishing(ctx, CancelGrace)
		defer stop()
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	req.Header.Set("Content-Type", "application/json")
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	// A redirect is never followed: following one would run a GET on
	// another route and pass its answer off as this call's (call answers
	// it as one that is not the API's, notTheAPI).
	noRedirects := *client
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	client = &noRedirects
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("call %s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	return res.StatusCode, b, err
}

// Instructions tell an agent how to use the gate; initialize answers them,
// and ratchet_begin's description carries them too, since many clients
// never show the model the server's instructions (MCP QA).
const Instructions = "Ask ratchet_begin before any side effect (email, charge, vendor call) and branch on " +
	"decision: execute → act, then ratchet_report with its lease_token; execute with probe: true → an earlier " +
	"attempt's outcome is unknown: first check at the vendor whether prior_attempt happened, and if it did, " +
	"report succeeded with what it did instead of acting again; duplicate → use result, do not act; " +
	"in_flight → wait retry_after_seconds, then ratchet_begin again with the same key and payload; blocked → " +
	"an earlier attempt's outcome is unknown: verify at the vendor, then ratchet_resolve with attempt: prior_attempt's " +
	"attempt (a key with effects:resolve; an AGENT key has not, so ask an operator); approval_required → wait for an operator's " +
	"decision, then ratchet_begin again with the same key and payload; denied (an error result carrying the " +
	"decision and its code) → do not act, stop and report why. Report failed only when the action surely did " +
	"not happen; if unsure, report nothing. A report refused lease_expired or lease_lost: do not act again."

// New builds the MCP server. defaultAuth (for example "Bearer rk_…" from the
// environment of the stdio binary) is used when a call carries no
// Authorization header of its own.
func New(c Caller, defaultAuth string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "ratchet", Version: Version}, &mcp.ServerOptions{
		Instructions: Instructions,
		// Tools only, and a fixed list: the SDK would also advertise
		// logging and tools.listChanged, which a stateless endpoint
		// answering each request on its own never sends (MCP QA).
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
	})
	s.AddReceivingMiddleware(refuseNotOffered)
	for _, t := range tools {
		t.add(s, c, defaultAuth)
	}
	return s
}

// notOffered prefixes the methods of the capabilities the server does not
// advertise: the SDK answered them anyway (an empty resource list, {} to a
// log level) as if it offered them (MCP QA).
var notOffered = []string{"resources/", "prompts/", "logging/", "completion/"}

// refuseNotOffered answers a method of a capability the server does not
// advertise as one it does not know.
func refuseNotOffered(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if notOfferedMethod(method) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "Method not found"}
		}
		return next(ctx, method, req)
	}
}

// Handler serves MCP over streamable HTTP, statelessly with JSON responses,
// which suits serverless: any instance can answer any request.
//
// The transport's localhost guard is off. It refuses a request that
// reached a loopback address under another Host, which is every request a
// reverse proxy or tunnel on the same host forwards (QA: MCP answered 403
// behind them while REST answered). The route refuses a browser's
// cross-origin request itself, before this handler (lib/httpapi,
// crossOrigin); against DNS rebinding, every request must carry an API key
// in its Authorization header, which a page that rebinds a name to
// 127.0.0.1 cannot make a browser send.
//
// A tool call stops when its request ends (boundToCarrier), as a REST call
// does when its client hangs up.
func Handler(s *mcp.Server) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, withCarrier(r)) })
}

// call runs one REST call and turns its answer into a tool result: the API's
// JSON as text and structured content, an error result for non-2xx answers.
func call(ctx context.Context, c Caller, req *mcp.CallToolRequest, defaultAuth, method, path string, body any) (*mcp.CallToolResult, error) {
	tool := ""
	if method == http.MethodPost && path == beginPath {
		tool = beginTool
	}
	auth := authOf(req, defaultAuth)
	// Unescaped (jsonx.Marshal): json.Marshal wrote each <, > and & as six
	// bytes, so a result within the API's limit through REST was refused
	// payload_too_large through MCP, after the agent had acted (QA).
	var raw []byte
	if body != nil {
		var err error
		if raw, err = jsonx.Marshal(body); err != nil {
			return nil, fmt.Errorf("encode arguments: %w", err)
		}
	}
	callCtx := ctx
	if method == http.MethodGet {
		callCtx = readWithin(ctx, roomOf(ctx)) // a list's page fits in what the answer has left
	}
	status, resp, err := c.Call(callCtx, method, path, auth, raw)
	if err != nil {
		return fit(ctx, tool, unanswered(err), nil, "")
	}
	if !fromAPI(status, resp) {
		return fit(ctx, tool, notTheAPI(status), nil, "")
	}
	if ctx.Err() != nil {
		resp = saidStopped(ctx, resp)
	}
	res := resultOf(status, resp)
	var undo func(context.Context)
	if b, ok := body.(BeginInput); ok && b.RequestID == nil && path == beginPath {
		// A lease only this answer would have told of: given back, as
		// one whose request was cancelled is (ReleaseUnseen).
		undo = func(ctx context.Context) {
			result, err := json.Marshal(res)
			if err == nil {
				_, _ = ReleaseUnseen(ctx, c, auth, result)
			}
		}
	}
	return fit(ctx, tool, res, undo, readsOutcome(method, path, tool, res))
}

// authOf is the Authorization a tool call's REST call is sent with: the
// header of the HTTP request that carried it, else defaultAuth.
func authOf(req *mcp.CallToolRequest, defaultAuth string) string {
	if req != nil && req.Extra != nil && req.Extra.Header != nil {
		if h := req.Extra.Header.Get("Authorization"); h != "" {
			return h
		}
	}
	return defaultAuth
}

// resultOf is the tool result of resp, the API's answer with status: its
// JSON as text and as structured content, numbers as the API wrote them
// (json.Number), not float64s. Only a 2xx is the tool's success; a
// redirect (which no route answers on purpose) is an error too.
func resultOf(status int, resp []byte) *mcp.CallToolResult {
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(resp)}},
		IsError: status < 200 || status >= 300}
	var structured map[string]any
	dec := json.NewDecoder(bytes.NewReader(resp))
	dec.UseNumber()
	if !nestsDeeperThan(resp, MaxAnswerNesting-structuredLevels) && dec.Decode(&structured) == nil {
		res.StructuredContent = structured
	}
	return res
}

// readsOutcome names the tool that reads what a call changed, when it
// changed something whose sending again is not the same answer: a write
// the API took (2xx) other than a begin (which, sent again, answers the
// same grant, or a new one once its lease was given back). "" otherwise.
func readsOutcome(method, path, tool string, res *mcp.CallToolResult) string {
	switch {
	case method == http.MethodGet || tool == beginTool || res.IsError:
		return ""
	case strings.HasPrefix(path, "/api/v1/approvals/"):
		return "ratchet_list_approvals"
	default:
		return "ratchet_get_effect"
	}
}

// MaxAnswerNesting is how many levels of arrays and objects an answer of
// the endpoint nests at most: as many as the API reads in a request body,
// and all the SDK the endpoint is built on writes (encoding/json's limit).
// An answer holding the REST answer as structured content two levels
// deeper than that (a result the gate took through REST 9 997 or more
// levels deep, read back by ratchet_get_effect) could not be written: the
// SDK dropped it, and the call went unanswered (QA: the request hung
// until the client gave up). Such an answer carries the REST answer as
// its text alone.
const MaxAnswerNesting = 10000

// structuredLevels is how far down a message holds its structured content:
// {"result": {"structuredContent": …}}.
const structuredLevels = 2

// nestsDeeperThan reports whether the JSON text doc nests arrays and
// objects more than max levels deep (brackets inside strings do not count).
func nestsDeeperThan(doc []byte, max int) bool {
	depth, deeper := 0, false
	jsonx.OutsideStrings(doc, func(c byte) bool {
		switch c {
		case '{', '[':
			depth++
			deeper = depth > max
		case '}', ']':
			depth--
		}
		return deeper
	})
	return deeper
}

// pathEscape keeps user-supplied path segments inside their segment. A "."
// or ".." is sent escaped (%2E), so that it reaches the REST route as the
// value it is, answered in the route's words (an effect type refused by
// REST's rule, an id "No such effect"), where a dot segment names no route
// at all ("No such route"; MCP review: an effect type the tool's schema
// refused reached it once the REST route checked the URL's values).
func pathEscape(s string) string {
	if s == "." || s == ".." {
		return strings.ReplaceAll(s, ".", "%2E")
	}
	return url.PathEscape(s)
}

// CodeServerUnreachable is the code of a tool call the Ratchet server never
// answered (the stdio binary could not reach it, or the connection failed):
// not one of the API's refusals, which only the server makes.
const CodeServerUnreachable = "server_unreachable"

// unanswered is the tool result of a call that got no answer. As for the
// API's database_unavailable, detail.outcome says whether the call may have
// been applied: not_applied when no connection was made, unknown once the
// request may have been sent (a retry under the same idempotency key,
// request_id or lease token answers what happened).
func unanswered(err error) *mcp.CallToolResult {
	outcome := apierr.OutcomeUnknown
	var (
		op   *net.OpError
		cert *tls.CertificateVerificationError
		rec  tls.RecordHeaderError
	)
	// No connection, or a TLS handshake that failed (an untrusted
	// certificate, a server that does not speak TLS): nothing was sent
	// (MCP QA: a certificate error read as "unknown").
	if (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &cert) || errors.As(err, &rec) {
		outcome = apierr.OutcomeNotApplied
	}
	return errorResult(map[string]any{"code": CodeServerUnreachable,
		"message": "The Ratchet server did not answer: " + err.Error(),
		"detail":  map[string]any{"outcome": outcome}})
}

// fromAPI reports whether an answer is the API's own: every route a tool
// calls answers a JSON object, and a refusal the error envelope with its
// code. Anything else came from something in front of the server (a
// proxy's 502 page, a gateway's timeout, a redirect, a web page at a wrong
// RATCHET_BASE_URL) or was cut short (MCP QA: a 200 HTML page was passed
// off as a successful ratchet_begin, with no decision in it, and a 502 page
// as an error without a code or an outcome).
func fromAPI(status int, resp []byte) bool {
	var answer map[string]json.RawMessage
	if !json.Valid(resp) || json.Unmarshal(resp, &answer) != nil || answer == nil {
		return false
	}
	if status >= 200 && status < 300 {
		return true
	}
	var envelope struct {
		Code string `json:"code"`
	}
	return json.Unmarshal(answer["error"], &envelope) == nil && envelope.Code != ""
}

// notTheAPI is the tool result of an answer that is not the API's
// (fromAPI): the Ratchet server did not answer the call, something else
// did. Its body is not relayed. A redirect, or a 4xx, came from what stood
// in front and passed nothing on (not_applied); a 2xx or a 5xx may come
// after the call reached the server (a gateway's timeout while it ran):
// unknown, retried under the same idempotency key and request_id.
func notTheAPI(status int) *mcp.CallToolResult {
	outcome, why := apierr.OutcomeUnknown, "an answer that is not the API's JSON"
	switch {
	case status >= 300 && status < 400:
		outcome, why = apierr.OutcomeNotApplied, "a redirect (does RATCHET_BASE_URL need https:// or another host?)"
	case status >= 400 && status < 500:
		outcome = apierr.OutcomeNotApplied
	}
	return errorResult(map[string]any{"code": CodeServerUnreachable,
		"message": fmt.Sprintf("The Ratchet server did not answer: HTTP %d with %s came from something in front "+
			"of it (a proxy or gateway, or another site at this base URL)", status, why),
		"detail": map[string]any{"outcome": outcome, "status": status}})
}
