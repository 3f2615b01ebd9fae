package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

// mcpEndpoint lazily builds the MCP handler over this server's own router, so
// every tool call goes through the same authentication, scopes and
// validation as the REST call it mirrors.
type mcpEndpoint struct {
	once    sync.Once
	handler http.Handler
}

func (s *Server) mcpRoutes() []Route {
	serve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			// Stateless with JSON responses: there is no event stream to
			// open (GET) and no session to end (DELETE). The transport
			// answers both 405, which MCP clients read as "not offered";
			// this says so in the API's envelope.
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, apierr.Of(apierr.CodeMethodNotAllowed,
				"This MCP endpoint is stateless: send each JSON-RPC message with POST."))
			return
		}
		if crossOrigin.Check(r) != nil {
			writeError(w, crossOriginRefused())
			return
		}
		if !acceptsJSON(r.Header.Values("Accept")) {
			// Refused here, not by the transport: it reads no q values
			// ("application/json;q=0, text/event-stream" was served JSON,
			// QA), and its message asks for both types where JSON alone
			// is served.
			writeEnvelopeError(w, mcpserver.AcceptRefused())
			return
		}
		// Every answer is JSON (no event stream is offered), so a client
		// that accepts JSON, or says nothing of what it accepts, is
		// served; the transport wants both types listed (MCP QA: Accept:
		// application/json alone was refused, 400).
		r.Header.Set("Accept", "application/json, text/event-stream")
		// The body is read here, as a route reads its own (readBody), so
		// that an oversized request gets the API's 413 envelope rather
		// than the transport's plain text; a compressed one is refused as
		// REST refuses it (MCP QA: the header was ignored).
		// Within the route's Timeout (RouteTime), as a route reads its
		// body: a late one is 408 (a body held whole by an adapter
		// included).
		bounded, ok := RouteTime(r.Context())
		if !ok {
			bounded = r.Context()
		}
		body, err := readBody(r.WithContext(bounded))
		if err != nil {
			e, _ := apierr.As(err) // readBody answers only *apierr.Error
			writeError(w, e)
			return
		}
		if e := mcpserver.CheckEnvelope(body); e != nil {
			writeEnvelopeError(w, e)
			return
		}
		if !jsonContent(r.Header.Get("Content-Type")) {
			// As the transport refuses it (finish rewrites its 415), and
			// before a body of notifications no one serves is answered 202
			// without reaching the transport (MCP QA: such a body was
			// taken under any Content-Type, another refused).
			writeError(w, contentTypeRefused())
			return
		}
		body, anyLeft := mcpserver.AnswerUnknown(body)
		if !anyLeft {
			w.WriteHeader(http.StatusAccepted) // notifications only, none the server takes
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		// The answer to it holds at most answer.Budget: its tool calls
		// share what is left of it (mcpserver.Room).
		// Its tool calls are stopped at the route's Timeout, as a route's
		// work is, and answered so; the transport keeps a context that
		// outlives it, to write that answer (mcpserver.Carried, below).
		// They ran unbounded on the local server.
		//
		// The transport waits for those answers, and what its answer will
		// not tell of is given back (a lease its cancelled or refused
		// ratchet_begin was granted), until half the AnswerMargin past the
		// route's Timeout, the other half left to write the answer: the
		// function may be stopped as early as AnswerMargin past it
		// (FunctionTimeout). The request's own context is not what the
		// transport waits under: behind the Lambda adapter it ends with the
		// route's time (AnswerMargin before the invocation), and the
		// transport, which writes nothing once it ends, answered a batch
		// stopped there 200 with no body, when it lost the race with the
		// calls' answers (AL review follow-up). A client that hangs up
		// still stops the calls (the carrier).
		ctx := mcpserver.WithRoom(mcpserver.Carried(r.Context(), bounded), body)
		if deadline, ok := bounded.Deadline(); ok {
			answerBy := deadline.Add(AnswerMargin / 2)
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(context.WithoutCancel(mcpserver.GiveBackBy(ctx, answerBy)), answerBy)
			defer cancel()
		}
		r = r.WithContext(ctx)
		s.mcp.once.Do(func() { s.mcp.handler = s.mcpHandler() })
		jw := &jsonRPCErrors{ResponseWriter: w, body: body, release: s.releaseUnseen(r)}
		s.mcp.handler.ServeHTTP(jw, r)
		jw.finish()
	})
	summary := "MCP (streamable HTTP, stateless, JSON responses): the effect gate's nine tools. " +
		"Send the API key as Authorization: Bearer on each request (any valid key opens the endpoint; " +
		"each tool call is the REST call it names, with that call's scopes). GET and DELETE answer 405. An " +
		"answer holds at most about 4 MB: a list tool's page ends early (next_cursor) to fit, and a tool call " +
		"of a batch whose result would take the batch's answer past it is answered a JSON-RPC error (-32600) " +
		"instead, to be sent again alone or in a smaller batch, or, for a write that ran (a report, a heartbeat, " +
		"a resolve, a decision), a short result saying it was applied and which tool reads its outcome; room is kept for each ratchet_begin's decision, " +
		"which is always answered (a duplicate's large result aside). A request of a batch that a " +
		"notifications/cancelled of the batch names is not answered (MCP): it is left out of the batch's answer; " +
		"a ratchet_begin without request_id granted as its cancellation landed has its lease given back " +
		"(reported failed, its attempt spent) before the answer is written, so the key's next begin is execute, " +
		"not in_flight."
	var routes []Route
	for _, m := range []string{"POST", "GET", "DELETE"} {
		rt := Route{
			Method: m, Pattern: "/api/v1/mcp", Name: "mcp." + strings.ToLower(m),
			Tag: "mcp", Summary: summary, Status: 200, Timeout: FunctionTimeout - AnswerMargin, Raw: serve,
		}
		if m != http.MethodPost {
			rt.Status, rt.Errors = http.StatusMethodNotAllowed, []string{apierr.CodeMethodNotAllowed}
		} else {
			// A message the transport cannot take is a JSON-RPC error
			// response (HTTP 400); a wrong content type is the envelope's.
			rt.Errors = []string{apierr.CodeInvalidRequest, apierr.CodeForbidden}
			// A batch (a JSON-RPC array) is taken under the protocol
			// versions that have them, and answered with an array.
			rt.Request = batchOf{One: mcpMessage{}, Max: mcpserver.MaxBatch}
			rt.Response = batchOf{One: mcpAnswer{}, Max: mcpserver.MaxBatch}
			rt.ErrorBodies = map[int]any{http.StatusBadRequest: mcpAnswer{},
				http.StatusNotFound: describedBody{Why: "Under protocol 2026-07-28 (MCP-Protocol-Version), a " +
					"JSON-RPC error -32601 under the request's id: a method not served, or one that version " +
					"dropped (ping, initialize)", Body: mcpAnswer{}}}
			rt.Bodiless = map[int]string{http.StatusAccepted: "Accepted: a JSON-RPC notification or response, " +
				"which has no answer, or a batch whose every request a notifications/cancelled of the batch " +
				"cancelled (a cancelled request is not answered)"}
		}
		routes = append(routes, rt)
	}
	return routes
}

// mcpHandler is the MCP endpoint's transport, each tool call made through
// this server's router.
func (s *Server) mcpHandler() http.Handler {
	return mcpserver.Handler(mcpserver.New(mcpserver.HandlerCaller{Handler: s}, ""))
}

// releaseUnseen gives back, under r's key, the leases the ratchet_begin
// results left out of r's answer grant (mcpserver.ReleaseUnseen): their
// requests were cancelled, and the answer, the only thing that told of a
// lease, is not sent. It is done before the answer is written, all within
// mcpserver.GiveBackTimeout of r's end (cancelled or not), and by half the
// AnswerMargin past the route's Timeout (mcpserver.GiveBackBy), so that
// the client's next begin of a key is answered execute, where it was
// in_flight until the lease lapsed, then blocked (MCP QA). Said in the log,
// naming nothing of the call.
func (s *Server) releaseUnseen(r *http.Request) func(results []json.RawMessage) {
	auth := r.Header.Get("Authorization")
	return func(results []json.RawMessage) {
		if len(results) == 0 {
			return
		}
		ctx, stop := mcpserver.GivingBack(r.Context(), mcpserver.GiveBackTimeout)
		defer stop()
		for _, result := range results {
			switch released, err := mcpserver.ReleaseUnseen(ctx, mcpserver.HandlerCaller{Handler: s}, auth, result); {
			case err != nil:
				s.Logger.Warn("mcp: a cancelled ratchet_begin was granted a lease; giving it back failed: it "+
					"lapses on its own", "err", err)
			case released:
				s.Logger.Info("mcp: a cancelled ratchet_begin was granted a lease; reported failed, its key is " +
					"free for a retry")
			}
		}
	}
}

// writeEnvelopeError answers a message refused before the transport read
// it: a request's answer is a 200 (as the transport's are); a message
// refused whole, with no id to answer, a 400.
func writeEnvelopeError(w http.ResponseWriter, e *mcpserver.EnvelopeError) {
	status, id := http.StatusBadRequest, json.RawMessage("null")
	if e.ID != nil {
		status, id = http.StatusOK, e.ID
	}
	writeJSON(w, status, map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": e.Code, "message": e.Message}})
}

// acceptsJSON reports whether an Accept header's values take a JSON answer:
// none at all (RFC 9110: any type), or a range that covers application/json
// without a q of 0 ("not acceptable", RFC 9110 12.4.2). The most specific
// range that covers it decides (RFC 9110 12.5.1): application/json before
// application/*, before */* (QA: "application/json;q=0, */*" was served
// JSON, the */* read as yes); among ranges as specific, any that says yes.
func acceptsJSON(values []string) bool {
	if len(values) == 0 {
		return true
	}
	specificity, accepted := 0, false
	for _, value := range values {
		for _, token := range strings.Split(value, ",") {
			base, params, _ := strings.Cut(token, ";")
			var s int
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json":
				s = 3
			case "application/*":
				s = 2
			case "*/*":
				s = 1
			default:
				continue
			}
			yes := !refusedByQ(params)
			switch {
			case s > specificity:
				specificity, accepted = s, yes
			case s == specificity:
				accepted = accepted || yes
			}
		}
	}
	return accepted
}

// refusedByQ reports whether a media range's parameters carry a q of 0
// (any spelling of it: 0, 0.0, 0.000).
func refusedByQ(params string) bool {
	for _, p := range strings.Split(params, ";") {
		name, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "q") {
			continue
		}
		q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		return err == nil && q == 0
	}
	return false
}

// jsonContent reports whether a Content-Type is application/json (any
// parameters, any case), as the transport reads it.
func jsonContent(value string) bool {
	mediaType, _, err := mime.ParseMediaType(value)
	return err == nil && mediaType == "application/json"
}

// contentTypeRefused answers a message sent as another type than JSON.
func contentTypeRefused() *apierr.Error {
	return apierr.InvalidField("Content-Type", "must be application/json")
}

// crossOrigin refuses a browser's request sent from a page of another
// origin: MCP's streamable HTTP transport must validate Origin (MCP QA: any
// Origin was served). It reads Sec-Fetch-Site, which every current browser
// sends, and else compares Origin with Host; a request with neither (every
// non-browser client) passes, as does one through a proxy that rewrites
// Host when the browser says it is same-origin. It does not stop DNS
// rebinding, whose page is same-origin to the browser (review): the key
// every request needs does, as a rebinding page cannot make the browser
// send one, and the API answers no cross-origin read (no CORS).
var crossOrigin = http.NewCrossOriginProtection()

// crossOriginRefused is the answer to a request crossOrigin refuses.
func crossOriginRefused() *apierr.Error {
	e := apierr.Forbidden()
	e.Message = "A browser page of another origin may not call this MCP endpoint (Origin and Host differ, " +
		"or Sec-Fetch-Site is cross-site): call it from a server, or from a page of its own origin."
	e.Detail["reason"] = "cross_origin"
	return e
}

// mcpMessage is a JSON-RPC 2.0 message as POST /api/v1/mcp takes it, for
// the OpenAPI document (QA: it showed no body); the transport parses it. It
// is a request or a notification (method), or the client's response to a
// request of the server's (result or error under its id), which is taken
// and answered 202 as a notification is (QA: the document required method,
// so a response matched none of it).
type mcpMessage struct {
	JSONRPC string `json:"jsonrpc" openapi:"enum=2.0"`
	// ID is a string or an integer; a notification has none.
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *mcpAnswerError `json:"error,omitempty"`
}

// OneOfRequired says what mcpserver.CheckEnvelope asks of a message: a
// method, a result or an error, only one of them (MCP QA: a request holding
// a result ran as the request, and the document took it).
func (mcpMessage) OneOfRequired() []string { return []string{"method", "result", "error"} }

// mcpAnswer is a JSON-RPC 2.0 response: its result, or its error (also the
// body of a 400 for a message the transport cannot take).
type mcpAnswer struct {
	JSONRPC string          `json:"jsonrpc" openapi:"enum=2.0"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *mcpAnswerError `json:"error,omitempty"`
}

// mcpAnswerError is a JSON-RPC error object: its code is an integer
// (-32700 parse error, -32600 invalid request, -32601 method not found,
// -32602 invalid params).
type mcpAnswerError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// jsonRPCErrors turns the transport's plain-text refusals into answers an
// MCP client can read: a message it cannot take (malformed JSON, another
// jsonrpc version, an unknown method) becomes a JSON-RPC error response, and
// a refused content type the API's envelope. A JSON answer is held until
// finish, which quiets the messages of its JSON-RPC errors (mcpserver.QuietErrors).
// Anything else passes through.
type jsonRPCErrors struct {
	http.ResponseWriter
	body    []byte // the request, for the id of the message refused
	decided bool   // WriteHeader was called (or implied by a Write)
	mode    answerMode
	status  int
	held    bytes.Buffer
	// release gives back the leases of the cancelled ratchet_begin
	// results left out of the answer (Server.releaseUnseen).
	release func(results []json.RawMessage)
}

type answerMode int

const (
	passThrough    answerMode = iota
	rewriteRefusal            // a plain-text refusal, rewritten by finish
	holdJSON                  // a JSON answer, written by finish
)

func (j *jsonRPCErrors) WriteHeader(status int) {
	if j.decided {
		return
	}
	j.decided, j.status = true, status
	ct := j.Header().Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/json"):
		j.mode = holdJSON
	case status >= 400:
		j.mode = rewriteRefusal
	default:
		j.ResponseWriter.WriteHeader(status)
	}
}

func (j *jsonRPCErrors) Write(b []byte) (int, error) {
	j.WriteHeader(http.StatusOK) // implied, as net/http does
	if j.mode != passThrough {
		return j.held.Write(b)
	}
	return j.ResponseWriter.Write(b)
}

// Flush passes through, except for an answer held for finish.
func (j *jsonRPCErrors) Flush() {
	if f, ok := j.ResponseWriter.(http.Flusher); ok && j.mode == passThrough {
		f.Flush()
	}
}

// finish writes the answer held, if any: a JSON one with its errors
// quieted and the answers of the requests its batch cancelled left out
// (their leases only those answers told of given back first), or the
// transport's refusal rewritten.
func (j *jsonRPCErrors) finish() {
	mode := j.mode
	j.mode = passThrough
	switch mode {
	case passThrough:
		return
	case holdJSON:
		j.Header().Del("Content-Length")
		held, anyLeft := j.held.Bytes(), true
		if j.status == http.StatusOK {
			// A request the batch cancels is not answered, as MCP asks;
			// a lease only its answer told of is given back first, so
			// that the key is free once the client reads the answer.
			var unseen []json.RawMessage
			held, anyLeft, unseen = mcpserver.LeaveOutCancelled(j.body, held)
			j.release(unseen)
		}
		if !anyLeft {
			j.Header().Del("Content-Type")
			j.ResponseWriter.WriteHeader(http.StatusAccepted) // as a batch of notifications only
			return
		}
		j.ResponseWriter.WriteHeader(j.status)
		// Written without the SDK's HTML escapes: each <, > and & of a
		// tool result's text and structured content took six bytes, past
		// what its room reckoned (answer.Budget).
		_, _ = j.ResponseWriter.Write(jsonx.Unescaped(mcpserver.QuietErrors(held)))
		return
	}
	j.Header().Del("Content-Length")
	if j.status == http.StatusUnsupportedMediaType {
		writeError(j.ResponseWriter, contentTypeRefused())
		return
	}
	code := int64(jsonrpc.CodeInvalidRequest)
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	msg := strings.TrimSpace(j.held.String())
	if rest, ok := strings.CutPrefix(msg, "Bad Request: Unsupported protocol version"); ok {
		// The transport's refusal of the header, which it does not name
		// (MCP QA: read as the initialize's protocolVersion being wrong).
		msg = "Bad Request: the MCP-Protocol-Version header names a protocol version this server does not support" + rest
	}
	// The class is read from the message quieted (QuietMessage), which
	// quotes none of the caller's values: the transport's own message
	// quotes them, and a jsonrpc or method of another type holding the word
	// "unsupported" was answered -32601 (MCP QA).
	switch quiet := mcpserver.QuietMessage(msg, code); {
	case !json.Valid(j.body):
		code = jsonrpc.CodeParseError
	case strings.Contains(quiet, "unsupported") || strings.Contains(quiet, "not handled"):
		code = jsonrpc.CodeMethodNotFound
	}
	id := json.RawMessage("null")
	if json.Unmarshal(j.body, &probe) == nil && len(probe.ID) > 0 && (probe.ID[0] == '"' || (probe.ID[0] >= '0' && probe.ID[0] <= '9') || probe.ID[0] == '-') {
		id = probe.ID
	}
	status := j.status
	if code == jsonrpc.CodeMethodNotFound && string(id) != "null" {
		// A request's answer, as the methods not offered (resources/list...)
		// get theirs: a client may take a non-2xx for a broken transport
		// and never read the error (MCP QA).
		status = http.StatusOK
	}
	writeJSON(j.ResponseWriter, status, map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": code, "message": mcpserver.QuietMessage(msg, code)}})
}
