package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// ReplayedHeader marks an answer given again for an Idempotency-Key.
const ReplayedHeader = "Idempotent-Replayed"

// encoded is an answer already encoded: one recorded under an
// Idempotency-Key, or given again from the record.
type encoded struct {
	status   int
	body     []byte
	replayed bool
}

// writeEncoded writes a as writeJSON writes a body.
func writeEncoded(w http.ResponseWriter, a encoded) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if a.replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
	_, _ = w.Write(newline)
}

// runOnce runs an Idempotent route under the request's Idempotency-Key
// (values, the header's): the answer recorded for the same request from the
// same key is given again; otherwise the request claims the key, acts, and
// its success is recorded (lib/idempotency). A refusal or failure records
// nothing, so the corrected request may use the key.
func (s *Server) runOnce(ctx context.Context, c *Call, values []string) (any, error) {
	if len(values) != 1 {
		return nil, apierr.InvalidField(idempotency.Header, "must be given once")
	}
	if !idemkey.Valid(values[0]) {
		return nil, apierr.InvalidField(idempotency.Header, idemkey.Rule)
	}
	raw, err := io.ReadAll(c.R.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, apierr.PayloadTooLarge(MaxBodyBytes)
		}
		return nil, apierr.InvalidField("body", "could not be read")
	}
	c.R.Body = io.NopCloser(bytes.NewReader(raw))
	claim, stored, err := s.Idempotency.Begin(ctx, idempotency.Request{
		APIKeyID: c.Principal.KeyID, Key: values[0], Method: c.R.Method, Path: resolvedPath(c), Body: raw,
		Claim: c.RequestID,
	})
	switch {
	case errors.Is(err, idempotency.ErrReused):
		return nil, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This Idempotency-Key was sent with another request (route, path or body) in the last 24 hours.")
	case errors.Is(err, idempotency.ErrInFlight):
		return nil, apierr.Conflict(apierr.CodeRetryRequest,
			"A request with this Idempotency-Key is still being answered; send it again in a moment.").
			WithDetail("retry_after_seconds", 1)
	case err != nil:
		return nil, err
	case stored != nil:
		return encoded{status: stored.Status, body: stored.Body, replayed: true}, nil
	}

	body, err := c.Route.Handle(ctx, c)
	var answer encoded
	if err == nil {
		answer.status, answer.body = c.Route.Status, nil
		if rep, ok := body.(Reply); ok {
			answer.status, body = rep.Status, rep.Body
		}
		answer.body, err = jsonx.Marshal(body)
	}
	if err != nil {
		if gerr := claim.Finish(ctx, idempotency.Answer{}); gerr != nil {
			// The claim lapses on its own (idempotency.ClaimTTL).
			s.Logger.Warn("idempotency claim kept", "request_id", c.RequestID, "route", c.Route.Name, "err", gerr.Error())
		}
		return nil, err
	}
	if err := claim.Finish(ctx, idempotency.Answer{Status: answer.status, Body: answer.body}); err != nil {
		// Acted and answered, but unrecorded: a retry once the claim
		// lapses acts again, as it would without the header.
		s.Logger.Warn("idempotent answer not recorded", "request_id", c.RequestID, "route", c.Route.Name,
			"err", err.Error())
	}
	return answer, nil
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
