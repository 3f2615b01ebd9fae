package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// ReplayedHeader marks an answer given again for an Idempotency-Key, and
// OriginalRequestHeader names the request (its X-Request-Id) that acted.
const (
	ReplayedHeader        = "Idempotent-Replayed"
	OriginalRequestHeader = "Original-Request"
)

// encoded is an answer already encoded: one recorded under an
// Idempotency-Key, or given again from the record (original set: the
// request that acted).
type encoded struct {
	status   int
	body     []byte
	original string
}

var (
	jsonContentType = []string{"application/json; charset=utf-8"}
	noStore         = []string{"no-store"}
)

// writeEncoded writes an encoded JSON answer (writeJSON's too), marked as
// given again when it is.
func writeEncoded(w http.ResponseWriter, a encoded) {
	// Assigned, not Set: Set makes a one-value slice for each header of
	// every answer. The slices are shared, so nothing may change their
	// values in place (Set and Add replace a header's slice, net/http and
	// httptest only read it).
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	if a.original != "" {
		w.Header().Set(ReplayedHeader, "true")
		w.Header().Set(OriginalRequestHeader, a.original)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
	_, _ = w.Write(newline) // not appended: a claim's answer would be copied whole for it
}

// runOnce runs an Idempotent route under the request's Idempotency-Key
// (values, the header's): the answer recorded for the same request from the
// same key is given again; otherwise the request claims the key and acts in
// one transaction with the recording of its answer (db.BeginRequest,
// lib/idempotency), so that a retry never finds the work done and the
// answer missing. A request whose transaction rolled back did nothing and
// frees the key for the corrected one. One whose COMMIT went unanswered
// finds out whether it landed and answers so (Claim.Settle); one that
// cannot find out keeps the key until the claim lapses, when the retry
// finds the answer or, if nothing committed, acts (review: recorded after
// the route's own commit, an answer lost with its instance let a retry act
// twice). One that could not reach the database to give its claim up or
// to find out frees the key once the database answers again, if nothing
// it did committed (Claim.GiveUp, Claim.Settle).
func (s *Server) runOnce(ctx context.Context, c *Call, values []string) (any, error) {
	if len(values) != 1 {
		return nil, apierr.InvalidField(idempotency.Header, "must be given once")
	}
	if !idemkey.Valid(values[0]) {
		return nil, apierr.InvalidField(idempotency.Header, idemkey.Rule)
	}
	raw, err := c.Body()
	if err != nil {
		return nil, err
	}
	c.R.Body = io.NopCloser(bytes.NewReader(raw)) // the handler decodes it
	claim, stored, err := s.Idempotency.Begin(ctx, idempotency.Request{
		APIKeyID: c.Principal.KeyID, Key: values[0], Method: c.R.Method, Path: resolvedPath(c), Body: raw,
		ID: c.RequestID,
	})
	var busy *idempotency.InFlightError
	var erased *idempotency.ErasedError
	switch {
	case errors.Is(err, idempotency.ErrReused):
		return nil, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This Idempotency-Key was sent with another request (route, path or body) in the last 24 hours.")
	case errors.As(err, &busy):
		return nil, retryRequest(busy.RetryAfter)
	case errors.As(err, &erased):
		if err := s.refuseRevokedReplay(ctx, c); err != nil {
			return nil, err
		}
		return erasedAnswer(c, erased)
	case lostDatabase(err):
		// The route never ran (Begin gave up a claim that may have
		// landed; one it could not give up holds the key until it
		// lapses, and a retry is told to wait).
		return nil, notApplied(ctx, err)
	case err != nil:
		return nil, err
	case stored != nil:
		if err := s.refuseRevokedReplay(ctx, c); err != nil {
			return nil, err
		}
		return encoded{status: stored.Status, body: stored.Body, original: stored.RequestID}, nil
	}

	answer, taken, err := s.actOnce(ctx, c, claim)
	var lost *commitNotLanded
	switch {
	case errors.As(err, &lost):
		// Its COMMIT went unanswered and did not land: the request
		// changed nothing, and its claim is given up (Claim.Settle).
		return nil, notApplied(ctx, lost.err)
	case errors.Is(err, db.ErrCommitUnknown):
		// Nobody could tell whether the COMMIT landed: the claim is kept
		// until it lapses, whatever the cause (a 503 says so; a 500 would
		// read as nothing done).
		return nil, databaseFailure(ctx, err, true)
	case taken:
		s.Logger.Warn("idempotent request outlived its claim; rolled back for the request that took the key",
			"request_id", c.RequestID, "route", c.Route.Name)
		return nil, retryRequest(time.Second)
	case err != nil:
		s.giveUp(ctx, c, claim)
		if lostDatabase(err) {
			// Whatever statement was in flight, its transaction never
			// committed: the request changed nothing.
			return nil, notApplied(ctx, err)
		}
		return nil, err
	}
	return answer, nil
}

// refuseRevokedReplay refuses the answer kept for an Idempotency-Key to a
// key revoked since: 401, as the call itself is refused. A route that
// checks its key in its own statements (ChecksKey: a key's mint, a step's
// replay) may take it from the instance's cache, and the answer given
// again runs none of those statements: a minting key revoked on another
// instance was handed, within KEY_CACHE_TTL, the secret of the live key it
// had minted (security QA). Every other route read the key afresh
// (Server.authorize).
func (s *Server) refuseRevokedReplay(ctx context.Context, c *Call) error {
	if c.Route.checksKeyAsItWrites() {
		return nil
	}
	revoked, err := auth.KeyRevoked(ctx, s.Pool, c.Principal.KeyID)
	switch {
	case lostDatabase(err):
		return notApplied(ctx, err)
	case err != nil:
		return err
	case revoked:
		return auth.ErrRevokedKey()
	}
	return nil
}

// giveUp frees the key of a request that changed nothing.
func (s *Server) giveUp(ctx context.Context, c *Call, claim *idempotency.Claim) {
	if err := claim.GiveUp(ctx); err != nil {
		// Given up in the background once the database answers again,
		// or it lapses on its own (idempotency.ClaimTTL).
		s.Logger.Warn("idempotency claim kept", "request_id", c.RequestID, "route", c.Route.Name,
			"err", err)
	}
}

// actOnce runs the route in a request transaction and records its answer
// in it. Unless the error wraps db.ErrCommitUnknown (and is no
// *commitNotLanded), nothing it did committed; taken: the claim was taken
// over, and the work was rolled back. A COMMIT that went unanswered but is
// found to have landed answers as one that was answered.
// A route that panics is rolled back and its key freed before the panic
// goes on to the router's recovery.
func (s *Server) actOnce(ctx context.Context, c *Call, claim *idempotency.Claim) (answer encoded, taken bool, err error) {
	actx, rt := db.BeginRequest(ctx, s.Pool)
	committed := false
	defer func() {
		if committed {
			return
		}
		// An error, a taken claim or a panic. The rollback gets a time of
		// its own; one that fails has closed the connection, and the
		// server ends the transaction with it.
		rctx, cancel := storeContext(ctx)
		defer cancel()
		if rerr := rt.Rollback(rctx); rerr != nil {
			s.Logger.Warn("request transaction not rolled back", "request_id", c.RequestID,
				"route", c.Route.Name, "err", rerr)
		}
		if p := recover(); p != nil {
			s.giveUp(ctx, c, claim)
			panic(p)
		}
	}()

	body, err := c.Route.Handle(actx, c)
	if err != nil {
		return encoded{}, false, err
	}
	answer.status = c.Route.Status
	if rep, ok := body.(Reply); ok {
		answer.status, body = rep.Status, rep.Body
	}
	if answer.body, err = jsonx.Marshal(body); err != nil {
		return encoded{}, false, err
	}
	// Recording and committing get a time of their own, from now: the
	// route may have spent most of the request's (review: taken before
	// the route ran, a route slower than StoreTimeout never committed).
	sctx, cancel := storeContext(ctx)
	defer cancel()
	stored := idempotency.Answer{Status: answer.status, Body: answer.body}
	if h, ok := body.(secretHolder); ok {
		stored.Resource = h.SecretOf()
	}
	if taken, err = claim.Record(sctx, rt, stored); err != nil || taken {
		return encoded{}, taken, err
	}
	if err := rt.Commit(sctx); err != nil {
		if !errors.Is(err, db.ErrCommitUnknown) {
			return encoded{}, false, err
		}
		// The COMMIT went unanswered (its connection ended): found out
		// on another connection, once the transaction has ended, as a
		// connection the server ended has at once (chaos QA: the key was
		// held 30 s, a worker's registration waited that long).
		landed, serr := claim.Settle(ctx)
		switch {
		case serr != nil:
			s.Logger.Warn("idempotent request's commit outcome unknown; its key is held until the database answers or the claim lapses",
				"request_id", c.RequestID, "route", c.Route.Name, "err", serr)
			return encoded{}, false, err
		case !landed:
			return encoded{}, false, &commitNotLanded{err: err}
		}
		rt.Landed()
	}
	committed = true
	return answer, false, nil
}

// secretHolder is an answer that shows the secret of the resource it
// names (auth.NewKey: a new key's secret; webhooks.NewWebhook: a new
// signing secret). Its kept answer is linked to that resource, whose
// delete (a key's revoke) erases it (idempotency.EraseAnswers).
type secretHolder interface{ SecretOf() string }

// erasedAnswer is what a request sent again under its Idempotency-Key is
// answered once the answer kept for it was erased with the resource whose
// secret it showed (the resource was deleted, or the key revoked, since):
// 404 not_found, as a deleted resource reads, marked as given again and
// naming the request that acted, so that the client learns its first
// request did act. It acts no more: the key stays used until its 24 hours
// end.
func erasedAnswer(c *Call, erased *idempotency.ErasedError) (any, error) {
	what, gone := pathResource(c.Route.Pattern, "id"), "deleted"
	if what == "key" {
		gone = "revoked" // a key is never deleted
	}
	e := apierr.New(http.StatusNotFound, apierr.CodeNotFound, "No such %s in this workspace: the %s this "+
		"request acted on was %s since, and the answer kept for its Idempotency-Key, which showed its secret, "+
		"was erased with it.", what, what, gone)
	body, err := jsonx.Marshal(errorBody{Error: e.Wire()})
	if err != nil {
		return nil, err
	}
	return encoded{status: e.Status, body: body, original: erased.RequestID}, nil
}

// commitNotLanded is a request whose COMMIT went unanswered and was found
// not to have landed (Claim.Settle, which gave its claim up): nothing it
// did committed.
type commitNotLanded struct{ err error }

func (e *commitNotLanded) Error() string {
	return "request transaction not committed: " + e.err.Error()
}
func (e *commitNotLanded) Unwrap() error { return e.err }

// storeContext bounds a step taken once the route has run (recording,
// committing, rolling back) by idempotency.StoreTimeout, whatever is left
// of the request's own time.
func storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), idempotency.StoreTimeout)
}

// lostDatabase says whether err is the database failing a request (which
// Server.fail answers with database_unavailable).
func lostDatabase(err error) bool {
	if e, ok := apierr.As(err); ok {
		return e.Code == apierr.CodeDatabaseUnavailable
	}
	// A deadlock's victim that RetryDeadlocks gave up on: rolled back, so a
	// 503 saying nothing was applied, for the client to retry.
	return db.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) || db.HasCode(err, db.CodeDeadlockDetected)
}

// timedOut says whether err is a statement that ran out of time (its own,
// or the request's, ctx) rather than a database that went away.
func timedOut(ctx context.Context, err error) bool {
	return errors.Is(err, context.DeadlineExceeded) ||
		(db.HasCode(err, db.CodeQueryCanceled) && errors.Is(ctx.Err(), context.DeadlineExceeded))
}

// notApplied is the 503 of a request the database failed before anything
// of its route could commit.
func notApplied(ctx context.Context, err error) *apierr.Error {
	return databaseFailure(ctx, err, false)
}

// databaseFailure is the 503 of a request the database failed: outcome
// unknown when its route may have committed (mayHaveApplied), else
// not_applied; said as a timeout when the failing statement ran out of
// time rather than losing the database.
func databaseFailure(ctx context.Context, err error, mayHaveApplied bool) *apierr.Error {
	if db.IsPoolBusy(err) && !mayHaveApplied {
		// Its last statement never got one of the instance's
		// connections, all in use (db.PoolWaitError).
		return apierr.PoolBusy(err)
	}
	e := apierr.DatabaseUnavailable(err)
	if mayHaveApplied {
		e = apierr.DatabaseLost(err)
	}
	if timedOut(ctx, err) {
		e = e.TimedOut()
	}
	return e
}

// retryRequest refuses a request whose key another request holds, asking
// for a retry after the whole seconds that cover after (at least one: a
// wait under a second read 0, retry at once; review).
func retryRequest(after time.Duration) error {
	return apierr.Conflict(apierr.CodeRetryRequest,
		"A request with this Idempotency-Key is still acting; send it again after retry_after_seconds.").
		WithDetail("retry_after_seconds", max(1, int((after+time.Second-1)/time.Second)))
}

// resolvedPath is the route's pattern with the request's path parameters in
// it: what names the resource acted on, however the request reached the
// router (a Vercel rewrite passes the parameters in the query).
func resolvedPath(c *Call) string {
	path := c.Route.Pattern
	for _, name := range c.Route.PathParams() {
		path = strings.Replace(path, "{"+name+"}", c.R.PathValue(name), 1)
	}
	return path
}

// retriedAction is said of an action that takes an Idempotency-Key though
// it creates nothing: one that sets a state another actor may set back
// (a breaker opened or closed, the stop, a step's cancel, an endpoint's
// pause), which a repeat sent after that change would undo.
const retriedAction = "Sent again without an Idempotency-Key (a retry after a lost answer), it acts again on " +
	"the state it then finds, undoing a change another actor made since; under the first request's " +
	"Idempotency-Key it is answered the first answer again and changes nothing."

// bodiless is h for an action without a body of its own that declares one
// (Request struct{}{}) to take an Idempotency-Key (mustKeyABody): the body,
// nothing or {}, is refused with any field in it, as Server.run refuses
// one sent to a route that declares none.
func bodiless(h HandlerFunc) HandlerFunc {
	return func(ctx context.Context, c *Call) (any, error) {
		var none struct{}
		if err := c.Decode(&none); err != nil {
			return nil, err
		}
		return h(ctx, c)
	}
}
