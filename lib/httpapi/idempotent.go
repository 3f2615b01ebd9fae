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

// writeEncoded writes an encoded JSON answer (writeJSON's too), marked as
// given again when it is.
func writeEncoded(w http.ResponseWriter, a encoded) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
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
// same key is given again; otherwise the request claims the key, acts, and
// its success is recorded (lib/idempotency). A request refused before it
// acted frees the key for the corrected one; one that may have acted (a
// lost connection, its time run out, a 500) keeps it until the claim lapses,
// so that a retry is not told to go ahead while the first may have
// committed (review, QA: a retry after a 503 with an unknown outcome made a
// second webhook).
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
	switch {
	case errors.Is(err, idempotency.ErrReused):
		return nil, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This Idempotency-Key was sent with another request (route, path or body) in the last 24 hours.")
	case errors.As(err, &busy):
		return nil, apierr.Conflict(apierr.CodeRetryRequest,
			"A request with this Idempotency-Key is still acting; send it again after retry_after_seconds.").
			WithDetail("retry_after_seconds", int(busy.RetryAfter/time.Second))
	case err != nil:
		return nil, err
	case stored != nil:
		return encoded{status: stored.Status, body: stored.Body, original: stored.RequestID}, nil
	}

	body, err := c.Route.Handle(ctx, c)
	if err != nil {
		if refusedBeforeActing(err) {
			if gerr := claim.GiveUp(ctx); gerr != nil {
				// The claim lapses on its own (idempotency.ClaimTTL).
				s.Logger.Warn("idempotency claim kept", "request_id", c.RequestID, "route", c.Route.Name,
					"err", gerr.Error())
			}
		}
		return nil, err
	}
	answer := encoded{status: c.Route.Status}
	if rep, ok := body.(Reply); ok {
		answer.status, body = rep.Status, rep.Body
	}
	if answer.body, err = jsonx.Marshal(body); err != nil {
		return nil, err // acted: the claim is kept until it lapses
	}
	taken, err := claim.Record(ctx, idempotency.Answer{Status: answer.status, Body: answer.body})
	switch {
	case err != nil:
		// Acted and answered, but unrecorded: a retry once the claim
		// lapses acts again, as it would without the header.
		s.Logger.Warn("idempotent answer not recorded", "request_id", c.RequestID, "route", c.Route.Name,
			"err", err.Error())
	case taken:
		s.Logger.Warn("idempotent request outlived its claim; a retry acted too", "request_id", c.RequestID,
			"route", c.Route.Name)
	}
	return answer, nil
}

// refusedBeforeActing says whether a handler's error leaves nothing done: a
// refusal of the request (4xx; not a client that went away mid-request) or
// a database that was not reached. Anything else may have committed.
func refusedBeforeActing(err error) bool {
	if e, ok := apierr.As(err); ok {
		if e.Code == apierr.CodeDatabaseUnavailable {
			return e.Detail["outcome"] == apierr.OutcomeNotApplied
		}
		return e.Status >= 400 && e.Status < 500 && e.Status != 499
	}
	return db.IsUnavailable(err) && db.Unapplied(err)
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
