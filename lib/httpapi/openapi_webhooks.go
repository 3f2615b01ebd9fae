package httpapi

import (
	"fmt"
	"slices"

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
					map[string]any{"properties": map[string]any{"type": map[string]any{"const": typ},
						"data": webhookData(typ)}},
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

// webhookData is the data of an event of type typ: every field always
// present, null where it does not apply. Gate events name their fields in
// snake_case, durable-job events in camelCase (API.md §0), and an
// endpoint's circuit.tripped and circuit.closed carry the endpoint's
// fields where a gate breaker's carry its effect type's. Only the README
// said what a few types carry (step.exhausted's, the emergency stop's), so
// a receiver of the others knew nothing of their fields (events QA;
// TestEveryEventTypeIsDeliveredAsTheDocumentSaysIt checks each type's
// delivered fields against these).
func webhookData(typ string) map[string]any {
	str := func(d string) map[string]any { return map[string]any{"type": "string", "description": d} }
	orNull := func(s map[string]any) map[string]any {
		s["type"] = []string{s["type"].(string), "null"}
		return s
	}
	at := func(d string) map[string]any {
		return map[string]any{"type": "string", "format": "date-time", "description": d}
	}
	integer := func(d string) map[string]any { return map[string]any{"type": "integer", "description": d} }
	boolean := func(d string) map[string]any { return map[string]any{"type": "boolean", "description": d} }
	enum := func(d string, values ...string) map[string]any {
		return map[string]any{"type": "string", "enum": values, "description": d}
	}
	object := func(props map[string]any) map[string]any {
		req := make([]string, 0, len(props))
		for k := range props {
			req = append(req, k)
		}
		slices.Sort(req)
		return map[string]any{"type": "object", "properties": props, "required": req}
	}
	endpointID, endpoint := str("the endpoint's id (end_…), as subject_id"), str("the endpoint's name")
	breaker := orNull(str("the effect type of the breaker; null for the emergency stop's (subject_id *)"))
	openedBy := enum("what opened the breaker", "surge", "manual", "stop")
	switch typ {
	case events.EffectIndeterminate:
		return object(map[string]any{"effect_id": str("the effect's id, as subject_id"), "effect_type": str("its type"),
			"attempt":          integer("the attempt whose outcome is unknown"),
			"lease_expired_at": at("when that attempt's lease lapsed")})
	case events.CircuitTripped:
		return map[string]any{"oneOf": []any{
			object(map[string]any{"effect_type": breaker, "opened_by": openedBy,
				"action":    enum("what the breaker does to begins", "monitor", "require_approval", "deny"),
				"opened_at": at("when it opened"), "closes_at": orNull(at("when its cooldown ends (null: closed only by hand)")),
				"volume_last_hour": orNull(integer("a surge's count of keys begun in the trailing hour")),
				"threshold":        orNull(integer("a surge's ceiling it passed"))}),
			object(map[string]any{"endpointId": endpointID, "endpoint": endpoint,
				"state": enum("the endpoint's circuit", "open"), "openedAt": at("when it opened"),
				"probeAt":             orNull(at("when a claim may try the endpoint again")),
				"consecutiveFailures": integer("the failures in a row that opened it")}),
		}}
	case events.CircuitClosed:
		return map[string]any{"oneOf": []any{
			object(map[string]any{"effect_type": breaker, "opened_by": openedBy, "opened_at": at("when it opened"),
				"closed_at": at("when it closed (a cooldown's end, when it lapsed)")}),
			object(map[string]any{"endpointId": endpointID, "endpoint": endpoint,
				"state": enum("the endpoint's circuit", "closed"), "openedAt": at("when it opened"),
				"closedAt": at("when it closed"), "closedBy": enum("what closed it", "success", "operator", "policy")}),
		}}
	case events.ApprovalRequested:
		return object(map[string]any{"approval_id": str("the approval's id, as subject_id"),
			"effect_id": str("the effect it holds"), "effect_type": str("its type"),
			"reason": enum("why it was asked for", "policy_requires_approval", "circuit_open", "cost_at_or_above_threshold")})
	case events.ApprovalDecided:
		return object(map[string]any{"approval_id": str("the approval's id, as subject_id"),
			"effect_id": str("the effect it held"), "effect_type": str("its type"),
			"state": enum("the decision", "approved", "rejected"),
			"answers": map[string]any{"type": []string{"array", "null"}, "items": map[string]any{"type": "string"},
				"description": "an approval's reasons it answers; null for a rejection"},
			"decided_by_key_id": orNull(str("the key that decided it (approved or rejected it, or closed it by a " +
				"resolution or an unwind); null for one no key decided"))})
	case events.ReconciliationDue:
		return object(map[string]any{"effect_type": str("the type to reconcile, as subject_id"),
			"reconcile_every_hours": integer("its policy's period"),
			"last_reconciled_at":    orNull(at("its last reconciliation (null: none yet)")),
			"due_at":                at("when this period's reconciliation fell due")})
	case events.RunFinished:
		return object(map[string]any{"status": enum("how the run ended", "SUCCEEDED", "FAILED"),
			"synthetic": boolean("the run is a tool test's (POST /tools/{name}/test; false for every other run)")})
	case events.StepExhausted:
		return object(map[string]any{"jobId": str("the step's durable job"), "runId": str("the step's run"),
			"attempt":     integer("its last attempt"),
			"leaseLapsed": boolean("the last attempt's lease lapsed without a report: its side effect may have happened"),
			"synthetic":   boolean("the step is a tool test's (POST /tools/{name}/test; false for every other step)")})
	case events.StepReplayed:
		return object(map[string]any{"jobId": str("the step's durable job"), "runId": str("the step's run"),
			"replayId":           str("the replay's audit id"),
			"keyId":              str("the key that asked for it"),
			"priorStatus":        enum("the step's status before it", "EXHAUSTED", "CANCELLED"),
			"attempt":            integer("the last attempt made so far (the next claim is attempt + 1)"),
			"maxAttempts":        integer("the job's lifetime ceiling"),
			"oldHandlerVersion":  str("the handler version before it"),
			"newHandlerVersion":  str("the handler version the next attempt runs"),
			"oldContractVersion": orNull(integer("the contract before it (null: none)")),
			"newContractVersion": orNull(integer("the contract the next attempt runs (null: none)"))})
	}
	return map[string]any{"type": "object"}
}
