package httpapi

import (
	"fmt"

	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// webhookDeliveries is the document's webhooks: what a subscription's
// receiver is sent for each event type, its body and its headers, and what
// its answer decides. The README alone said it, so a client generated from
// the document knew nothing of the deliveries it must verify (webhooks QA).
func webhookDeliveries() map[string]any {
	headers := []any{
		map[string]any{"name": "Ratchet-Signature", "in": "header", "required": true,
			"description": "t=<unix>,v1=<hex hmac-sha256(secret, \"<t>.<body>\")> over the raw body, signed afresh at " +
				"each attempt: one v1, a second (the previous secret's) while a rotated secret still signs. Accept the " +
				"delivery when any v1 verifies, compared in constant time, and refuse a t more than 5 minutes from your " +
				"clock (the SDKs' VerifyWebhook, verify_webhook and verifyWebhook do both).",
			"schema": map[string]any{"type": "string", "pattern": "^t=[0-9]+(,v1=[0-9a-f]{64}){1,2}$"}},
		map[string]any{"name": "Ratchet-Event-Id", "in": "header", "required": true,
			"description": "The event's id, as the body's id.", "schema": map[string]any{"type": "string"}},
	}
	answer := fmt.Sprintf("Any other answer, a redirect (not followed) or none within %s is sent again with backoff "+
		"(30 s doubling, capped at 6 h, ±20%% jitter), up to %d attempts; only the status code is kept. Delivery "+
		"is at least once and unordered: deduplicate by the event id.", webhooks.SendTimeout, webhooks.MaxAttempts)
	out := map[string]any{}
	for _, typ := range events.Types {
		out[typ] = map[string]any{"post": map[string]any{
			"operationId": "webhook." + typ,
			"summary":     "The " + typ + " event, POSTed to each subscription to it.",
			"tags":        []string{"webhooks"},
			"parameters":  headers,
			"requestBody": map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"allOf": []any{
					map[string]any{"$ref": "#/components/schemas/WebhookEvent"},
					map[string]any{"properties": map[string]any{"type": map[string]any{"const": typ}}},
				}},
			}}},
			"responses": map[string]any{
				"2XX":     map[string]any{"description": "Delivered: recorded delivered and not retried (a sweeper that stops between the send and its record sends it again: at least once, deduplicate by Ratchet-Event-Id)."},
				"default": map[string]any{"description": answer},
			},
		}}
	}
	return out
}

// webhookEventSchema is a delivery's body (webhooks.Payload), its data an
// object (raw JSON in Go).
func webhookEventSchema() any {
	s := schemaOf(webhooks.Payload{})
	if data, ok := s.(map[string]any)["properties"].(map[string]any)["data"].(map[string]any); ok {
		data["type"] = "object"
	}
	return s
}
