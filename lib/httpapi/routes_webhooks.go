package httpapi

import (
	"context"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// webhookRoutes are the webhook subscription routes (API.md §2.7).
func (s *Server) webhookRoutes() []Route {
	scopes := []string{auth.ScopeWebhooksWrite}
	return []Route{
		{
			Method: "POST", Pattern: "/api/v1/webhooks", Name: "webhooks.create", Tag: "webhooks", Scopes: scopes,
			Idempotent: true,
			Summary: "Subscribe a URL to events; returns the signing secret once. Deliveries are signed " +
				"Ratchet-Signature: t=<unix>,v1=<hex hmac-sha256(secret, \"<t>.<body>\")> and retried with backoff. " +
				"Sent again under its Idempotency-Key once the subscription was deleted: 404 not_found (" +
				ReplayedHeader + ": true), the answer that showed the secret erased with it.",
			Request: webhooks.CreateRequest{}, Response: webhooks.NewWebhook{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeInvalidState, apierr.CodeNotFound},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				var req webhooks.CreateRequest
				if err := c.Decode(&req); err != nil {
					return nil, err
				}
				return s.Webhooks.Create(ctx, c.Principal.WorkspaceID, req)
			},
		},
		{
			Method: "GET", Pattern: "/api/v1/webhooks", Name: "webhooks.list", Tag: "webhooks", Scopes: scopes,
			Summary: "List webhook subscriptions oldest first (never their secrets; secret_unreadable: true marks one whose " +
				"signing secret this server cannot decrypt, whose deliveries are not sent meanwhile).",
			Query:    listParams,
			Response: Page[webhooks.Webhook]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: idCursor(ids.Webhook),
			Handle: func(ctx context.Context, c *Call) (any, error) {
				limit, cursor, err := c.ListParams()
				if err != nil {
					return nil, err
				}
				list, err := s.Webhooks.List(ctx, c.Principal.WorkspaceID, cursor, limit+1)
				if err != nil {
					return nil, err
				}
				return NewPage(ctx, list, limit, func(w webhooks.Webhook) string { return w.ID })
			},
		},
		{
			Method: "GET", Pattern: "/api/v1/webhooks/{id}", Name: "webhooks.get", Tag: "webhooks", Scopes: scopes,
			Summary: "Read one subscription (its secret is shown only when it is created; secret_unreadable: true " +
				"when this server cannot decrypt it: sealed with an encryption key it is not configured with, or damaged).",
			Response: webhooks.Webhook{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Webhook)
				if err != nil {
					return nil, err
				}
				return s.Webhooks.Get(ctx, c.Principal.WorkspaceID, id)
			},
		},
		{
			Method: "DELETE", Pattern: "/api/v1/webhooks/{id}", Name: "webhooks.delete", Tag: "webhooks", Scopes: scopes,
			Summary: "End a subscription; its pending deliveries are abandoned and its signing secrets erased, " +
				"with the answers kept for its create's and rotations' Idempotency-Keys (sent again, they are 404). " +
				"Returns the subscription as the delete left it (deleting it again answers it again).",
			Response: webhooks.Webhook{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Webhook)
				if err != nil {
					return nil, err
				}
				return s.Webhooks.Delete(ctx, c.Principal.WorkspaceID, id)
			},
		},
		{
			Method: "PATCH", Pattern: "/api/v1/webhooks/{id}", Name: "webhooks.update", Tag: "webhooks", Scopes: scopes,
			Idempotent: true,
			Summary: "Change a subscription without deleting it (its secret and deliveries are kept): any of url and " +
				"events (checked as a create's) and disabled; at least one, none null; the others keep their value. " +
				"A disabled subscription's pending deliveries are held, and the events recorded while it is disabled " +
				"are skipped; enabled again, the held ones are sent (one held as long as the server keeps events ends failed, " +
				"expired while disabled, and goes with its event). A new url applies to every delivery not yet sent, " +
				"new events to the events fanned out from then on (pending deliveries of a type no longer listed end " +
				"failed). A send already on its way (at most 10 s) may still reach the old url. Returns the subscription. " +
				retriedAction,
			Request: webhooks.UpdateRequest{}, Response: webhooks.Webhook{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidRequest},
			Handle: webhookAction(s, (*webhooks.Service).Update),
		},
		{
			Method: "POST", Pattern: "/api/v1/webhooks/{id}/rotate-secret", Name: "webhooks.rotate_secret",
			Tag: "webhooks", Scopes: scopes, Idempotent: true,
			Summary: "Give a subscription a new signing secret, shown once. Until the previous secret expires " +
				"(previous_secret_expires_in_seconds, 0 to 604800, default 86400) deliveries carry a v1 signature " +
				"for each: accept a delivery when any v1 verifies, and move the receiver to the new secret meanwhile. " +
				"While an earlier rotation's previous secret still signs, 409 invalid_state unless replace_previous is true. " +
				"Sent again under its Idempotency-Key once the subscription was deleted: 404 not_found (" +
				ReplayedHeader + ": true), the answer that showed the secret erased with it.",
			Request: webhooks.RotateRequest{}, Response: webhooks.NewWebhook{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidRequest, apierr.CodeInvalidState},
			Handle: webhookAction(s, (*webhooks.Service).RotateSecret),
		},
		{
			Method: "GET", Pattern: "/api/v1/webhooks/{id}/deliveries", Name: "webhooks.deliveries", Tag: "webhooks",
			Scopes: scopes, Summary: "A subscription's deliveries, newest first: state, attempts, last status code.",
			Query: listParams, Response: Page[webhooks.Delivery]{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidRequest},
			Cursor: webhooks.ValidDeliveriesCursor,
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Webhook)
				if err != nil {
					return nil, err
				}
				limit, cursor, err := c.ListParams()
				if err != nil {
					return nil, err
				}
				list, err := s.Webhooks.Deliveries(ctx, c.Principal.WorkspaceID, id, cursor, limit+1)
				if err != nil {
					return nil, err
				}
				return NewPage(ctx, list, limit, webhooks.DeliveryCursor)
			},
		},
		{
			Method: "POST", Pattern: "/api/v1/webhooks/{id}/deliveries/retry", Name: "webhooks.deliveries.retry",
			Tag: "webhooks", Scopes: scopes, Idempotent: true,
			Summary: "Send deliveries of this subscription again (up to 100, by id), once the receiver is mended: " +
				"each that ended (delivered, or failed after its 12 attempts) is pending again, due now, its attempts " +
				"starting over (one with a send still on its way, ended meanwhile by a PATCH of the events, is due once " +
				"that send's claim lapses, at most a minute on, never sent twice at once; that send's failure makes it " +
				"due at once); one still pending keeps its schedule. Same event id: a receiver that deduplicates " +
				"skips what it took. Returns the deliveries as they now are.",
			Request: webhooks.RetryRequest{}, Response: webhooks.Retried{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidRequest},
			Handle: webhookAction(s, (*webhooks.Service).Retry),
		},
	}
}

// webhookAction handles a POST or PATCH on one subscription: its id from the path,
// a body of type Req, then act on the server's webhook service (read when
// the request comes, as every handler reads it).
func webhookAction[Req, Resp any](s *Server,
	act func(*webhooks.Service, context.Context, string, string, Req) (Resp, error)) func(context.Context, *Call) (any, error) {
	return func(ctx context.Context, c *Call) (any, error) {
		id, err := c.PathID("id", ids.Webhook)
		if err != nil {
			return nil, err
		}
		var req Req
		if err := c.Decode(&req); err != nil {
			return nil, err
		}
		return act(s.Webhooks, ctx, c.Principal.WorkspaceID, id, req)
	}
}
