package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// beginPath is ratchet_begin's REST route.
const beginPath = "/api/v1/effects/begin"

// beginTool is ratchet_begin's name.
const beginTool = "ratchet_begin"

// CancelGrace bounds a ratchet_begin sent over HTTP once its MCP request is
// cancelled: the call is not abandoned (HTTPCaller), it has this long more
// to bring back the server's decision.
const CancelGrace = 10 * time.Second

// finishing is ctx without its cancellation, for a call that must run to
// its answer: once ctx is cancelled the call has grace more, then is
// abandoned. stop releases it (call it when the call is done).
func finishing(ctx context.Context, grace time.Duration) (_ context.Context, stop context.CancelFunc) {
	detached, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopWatching := context.AfterFunc(ctx, func() {
		timer := time.AfterFunc(grace, cancel)
		context.AfterFunc(detached, func() { timer.Stop() })
	})
	return detached, func() { stopWatching(); cancel() }
}

// carrierKey holds the context of the HTTP request that carried a message
// to the streamable-HTTP endpoint (Handler).
type carrierKey struct{}

// withCarrier is r with its own context kept for the tool calls it carries
// (boundToCarrier), unless one was given them already (Carried).
func withCarrier(r *http.Request) *http.Request {
	if _, ok := r.Context().Value(carrierKey{}).(context.Context); ok {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), carrierKey{}, r.Context()))
}

// Carried is ctx, a request's to Handler, with carrier as the context its
// tool calls end with in place of the request's own: one that ends sooner
// (the route's Timeout) stops them while the transport, which writes
// nothing once the request's own context ends, can still answer.
func Carried(ctx, carrier context.Context) context.Context {
	return context.WithValue(ctx, carrierKey{}, carrier)
}

// boundToCarrier is ctx, a tool call's, cancelled too when the HTTP request
// that carried the call ends: its client hung up, or the request's deadline
// passed (Lambda's invocation deadline, or the route's Timeout: Carried). The SDK gives a call a context that its request's end never cancels
// (under every protocol version, by default), so a call whose client had gone ran on
// to its end (MCP QA: a ratchet_begin waiting on its group's lock was
// granted after its client hung up, a lease no one held, and the key
// answered in_flight to the retry), where README has it stop where it is,
// as a REST call does. stop releases it. Over stdio, with no carrier, it is
// ctx.
func boundToCarrier(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	carrier, ok := ctx.Value(carrierKey{}).(context.Context)
	if !ok {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	stopWatching := context.AfterFunc(carrier, cancel)
	return ctx, func() { stopWatching(); cancel() }
}

// saidStopped is resp, the REST answer of a tool call stopped as ctx, its
// own, ended, with its message saying so to an MCP client: the REST call's
// own was written for a REST client, to whom a request_timeout's "the
// request's body did not arrive… Send it again" is true, and misled through
// MCP, where the arguments had arrived and the call was stopped (MCP
// audit). The code, which README documents, is kept.
//
// Only a call stopped by the end of the HTTP request that carried it
// (boundToCarrier) is said stopped, naming that end: its client closed the
// connection (a client that half-closes it still reads the answer), or its
// deadline passed (the endpoint route's Timeout, lib/httpapi, or Lambda's
// invocation deadline). A call its client cancelled
// (notifications/cancelled) is never answered, over HTTP (LeaveOutCancelled)
// as over stdio (the binary drops the answer), so no message names that
// cause; any other answer, a call whose own context ended otherwise among
// them, is resp as it is.
func saidStopped(ctx context.Context, resp []byte) []byte {
	carrier, ok := ctx.Value(carrierKey{}).(context.Context)
	if !ok || carrier.Err() == nil {
		return resp
	}
	var envelope map[string]map[string]json.RawMessage
	if json.Unmarshal(resp, &envelope) != nil || envelope["error"] == nil {
		return resp
	}
	var code string
	_ = json.Unmarshal(envelope["error"]["code"], &code)
	why := "its client closed the connection of the HTTP request that carried it"
	if errors.Is(carrier.Err(), context.DeadlineExceeded) {
		why = "the HTTP request that carried it reached its deadline"
	}
	var msg string
	switch code {
	case apierr.CodeRequestTimeout:
		msg = "This tool call was stopped before its REST call had read its arguments, because " + why +
			": nothing was done."
	case apierr.CodeClientClosedRequest:
		msg = "This tool call was stopped where it was, because " + why + ": a ratchet_begin not yet granted " +
			"grants nothing (one granted as it stopped is a lost answer: a retry under its request_id gets " +
			"the lease back); ratchet_get_effect shows what another call did."
	default:
		return resp
	}
	envelope["error"]["message"], _ = json.Marshal(msg)
	out, err := jsonx.Marshal(envelope)
	if err != nil {
		return resp
	}
	return out
}

// BeginWithoutRequestID says whether params, a tools/call's, call
// ratchet_begin without a request_id: the lease token such a call may be
// granted is in its answer and nowhere else, so if the answer is dropped
// (its request cancelled), no one holds it (ReleaseUnseen). A begin naming
// its request_id is not one: a retry under that request_id is given the
// same lease (the documented recovery of a lost answer), and may have been,
// or may be while a report of failure is on its way, so its lease is left
// to that retry, or to lapse.
func BeginWithoutRequestID(params json.RawMessage) bool {
	var call struct {
		Name      string `json:"name"`
		Arguments struct {
			RequestID json.RawMessage `json:"request_id"`
		} `json:"arguments"`
	}
	if json.Unmarshal(params, &call) != nil || call.Name != beginTool {
		return false
	}
	return len(call.Arguments.RequestID) == 0 || string(call.Arguments.RequestID) == "null"
}

// Grant is what a ratchet_begin's tool result that grants execute holds.
type Grant struct {
	EffectID       string `json:"effect_id"`
	LeaseToken     string `json:"lease_token"`
	LeaseExpiresAt string `json:"lease_expires_at"` // RFC 3339, by the server's clock
	Probe          bool   `json:"probe"`
}

// GrantOf reads result, a ratchet_begin's tool result (a tools/call's
// JSON-RPC result); ok is false when it grants no execute.
func GrantOf(result json.RawMessage) (g Grant, ok bool) {
	var r struct {
		IsError    bool `json:"isError"`
		Structured struct {
			Decision string `json:"decision"`
			Grant
		} `json:"structuredContent"`
	}
	if json.Unmarshal(result, &r) != nil || r.IsError {
		return Grant{}, false
	}
	s := r.Structured
	if s.Decision != gate.DecisionExecute || s.EffectID == "" || s.LeaseToken == "" {
		return Grant{}, false
	}
	return s.Grant, true
}

// ReleaseUnseen gives back the lease that result, a ratchet_begin's tool
// result (a tools/call's JSON-RPC result), grants when that result will
// reach no one: its request, a BeginWithoutRequestID, was cancelled, and an
// MCP client ignores any answer to a request it cancelled, and no begin
// rejoined the lease (the stdio binary holds it for one a while first: a
// lease given back spends its attempt). Nothing can have acted under a lease
// whose token no one received, so the attempt is reported failed with that
// token: the key is free at once for the agent's retry, where it answered
// in_flight until the lease lapsed, then (on_indeterminate: block) blocked
// until an operator resolved it (MCP QA).
//
// A probe's grant is left to lapse: a probe reported failed settles the
// earlier attempt whose outcome is unknown as failed too, which no one
// checked at the vendor; lapsed, the next begin is a probe again. A result
// that grants nothing is left as it is. released says whether a lease was
// given back; an error (never naming the token) that it could not be, and
// lapses as before.
func ReleaseUnseen(ctx context.Context, c Caller, auth string, result json.RawMessage) (released bool, err error) {
	s, ok := GrantOf(result)
	if !ok || s.Probe {
		return false, nil
	}
	if ctx.Err() != nil {
		return false, errors.New("no time was left to give it back")
	}
	body, err := jsonx.Marshal(map[string]any{"lease_token": s.LeaseToken, "outcome": "failed"})
	if err != nil {
		return false, fmt.Errorf("encode report: %w", err)
	}
	status, _, err := c.Call(ctx, http.MethodPost, "/api/v1/effects/"+pathEscape(s.EffectID)+"/report", auth, body)
	switch {
	case err != nil:
		return false, errors.New("the server did not answer its report")
	case status < 200 || status >= 300:
		return false, fmt.Errorf("its report was answered HTTP %d", status)
	}
	return true, nil
}

// GiveBackTimeout bounds giving back, within an HTTP request, what leases
// its answer will not tell of (ReleaseUnseen): a begin's result that its
// batch's answer has no room for, or those its batch cancelled.
const GiveBackTimeout = 5 * time.Second

// GivingBack is the context to give back a lease under (ReleaseUnseen):
// ctx, that of the call or request that was granted it, without its
// cancellation, which is most often why the lease is given back, and ended
// within, or sooner at the end GiveBackBy set on ctx. stop releases it.
func GivingBack(ctx context.Context, within time.Duration) (_ context.Context, stop context.CancelFunc) {
	deadline := time.Now().Add(within)
	if end, ok := ctx.Value(giveBackByKey{}).(time.Time); ok && end.Before(deadline) {
		deadline = end
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// giveBackByKey holds the instant by which a request's leases are given
// back (GiveBackBy).
type giveBackByKey struct{}

// GiveBackBy is ctx, a request's to Handler, with end as the instant by
// which what its answer will not tell of is given back (GivingBack), all
// of it, whatever time is left of GiveBackTimeout: past it, the function
// serving the request may be stopped before the answer is written (AL
// review: a batch that ran to its route's 28 s gave back for 5 s more,
// past Lambda's 30 s, and its answer was lost). A lease not given back by
// then lapses, as one that could not be.
func GiveBackBy(ctx context.Context, end time.Time) context.Context {
	return context.WithValue(ctx, giveBackByKey{}, end)
}

// methodCancelled is the notification by which a client cancels a request.
const methodCancelled = "notifications/cancelled"

// CancelledRequest reads params, a notifications/cancelled's, for the id
// of the request it cancels, as the SDK reads it (a number is taken as the
// integer it truncates to); ok is false when it names none.
func CancelledRequest(params json.RawMessage) (id jsonrpc.ID, ok bool) {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	if err != nil || !id.IsValid() {
		return jsonrpc.ID{}, false
	}
	return id, true
}

// LeaveOutCancelled is answer, the transport's answer to body, without the
// answers to the requests of body that a notifications/cancelled of body
// names: MCP asks a receiver not to answer a request it was asked to cancel
// (its answers were sent anyway, as the SDK the endpoint is built on writes
// them, MCP QA). Only a batch can hold a request and its cancellation (each
// HTTP request is served on its own); where the notification sits in the
// batch does not matter, since the SDK cancels a request in the background
// and may reach one named before it. A request the cancellation reached
// stopped where it was; one it did not reach ran on and did what it did, as
// a REST call whose answer was lost. anyLeft is false when no answer is
// left: the batch is then answered as one of notifications only is, 202
// with no body.
//
// unseen holds the results left out of the ratchet_begin calls whose lease
// only their answer would have told of (BeginWithoutRequestID): one that
// was granted as its cancellation landed holds a lease no one holds, to be
// given back (ReleaseUnseen), as the stdio binary gives back such a lease
// (MCP QA: over HTTP it ran until it lapsed, the key answering in_flight,
// then blocked). A begin that named its request_id is left to a retry under
// it.
func LeaveOutCancelled(body, answer []byte) (_ []byte, anyLeft bool, unseen []json.RawMessage) {
	var batch []json.RawMessage
	if json.Unmarshal(body, &batch) != nil {
		return answer, true, nil // one message: it cancels nothing of its own
	}
	cancelled := map[jsonrpc.ID]bool{}
	begins := map[jsonrpc.ID]bool{} // the begins without request_id, by id
	for _, m := range batch {
		msg, err := jsonrpc.DecodeMessage(m)
		req, ok := msg.(*jsonrpc.Request)
		switch {
		case err != nil || !ok:
		case !req.ID.IsValid() && req.Method == methodCancelled:
			if id, ok := CancelledRequest(req.Params); ok {
				cancelled[id] = true
			}
		case req.ID.IsValid() && req.Method == "tools/call" && BeginWithoutRequestID(req.Params):
			begins[req.ID] = true
		}
	}
	var answers []json.RawMessage
	if len(cancelled) == 0 || json.Unmarshal(answer, &answers) != nil {
		return answer, true, nil
	}
	var kept [][]byte
	for _, a := range answers {
		msg, err := jsonrpc.DecodeMessage(a)
		if resp, ok := msg.(*jsonrpc.Response); err == nil && ok && resp.ID.IsValid() && cancelled[resp.ID] {
			if begins[resp.ID] && resp.Result != nil {
				unseen = append(unseen, resp.Result)
			}
			continue
		}
		kept = append(kept, a)
	}
	if len(kept) == 0 {
		return nil, false, unseen
	}
	return append(append([]byte("["), bytes.Join(kept, []byte(","))...), ']'), true, unseen
}
