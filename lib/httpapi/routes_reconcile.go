package httpapi

import (
	"context"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
)

// reconcileRoutes is reconciliation (API.md §2.7).
func (s *Server) reconcileRoutes() []Route {
	return []Route{
		{
			Method: "POST", Pattern: "/api/v1/reconcile", Name: "reconcile", Tag: "reconcile",
			Scopes: []string{auth.ScopeReconcileWrite}, Idempotent: true,
			Summary: "Compare the vendor's records (at most 10 000; status succeeded, refunded, failed or pending) " +
				"with Ratchet's effects of one type that happened in [from, to): by the start of each one's latest " +
				"attempt that did not fail (the one that may have reached the vendor), its creation when it has none; " +
				"records are matched by idempotency key whatever the window. Indeterminate effects a record settles " +
				"are resolved; a missing record proves nothing. Restarts the reconcile_every_hours calendar. " +
				"Under an Idempotency-Key header a retry whose answer was lost gets the first answer again " +
				"(its resolved list included), not a new comparison. An answer that would pass 4 MB of JSON " +
				"(every item of its lists, at up to about 450 bytes each with a 255-character key) is refused " +
				"400 invalid_request at to, as a window of more than 50 000 effects is, changing nothing (nothing " +
				"resolved, recorded or kept under the Idempotency-Key): narrow the window or send fewer records.",
			Request: gate.ReconcileRequest{}, Response: gate.Reconciliation{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodePayloadTooLarge},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				var req gate.ReconcileRequest
				if err := c.Decode(&req); err != nil {
					return nil, err
				}
				return s.Gate.Reconcile(ctx, c.Principal, req)
			},
		},
	}
}
