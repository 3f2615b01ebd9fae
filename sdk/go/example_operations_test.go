package ratchet_test

import (
	"context"
	"log"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// Effects the gate held for an operator (approvals:write) wait in the
// approvals list. Approving one lets its key's next begin execute (the agent
// calls DoEffect again); rejecting it denies every begin of the key.
func ExampleClient_Approve() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with an operator key
	// withinLimits stands in for your own check of the held effect.
	withinLimits := func(a ratchet.Approval) bool { return a.EffectType == "email.send" }

	q := ratchet.ApprovalQuery{State: ratchet.ApprovalPending}
	for {
		page, err := client.ListApprovals(ctx, q)
		if err != nil {
			log.Fatal(err)
		}
		for _, a := range page.Data {
			if withinLimits(a) {
				_, err = client.Approve(ctx, a.ID, "checked with finance")
			} else {
				_, err = client.Reject(ctx, a.ID, "over the agent's mandate")
			}
			if err != nil {
				log.Fatal(err)
			}
		}
		if page.NextCursor == nil { // the last page
			break
		}
		q.Cursor = *page.NextCursor
	}
}

// A policy change made against the version read: another operator's change
// in between is refused (version_conflict) instead of overwritten. Names are
// the API's snake_case ones; nil clears a field.
func ExampleClient_UpdateEffectPolicy() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with a key with policies:write

	p, err := client.GetEffectPolicy(ctx, "wire.send") // Version 0: the safe default
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.UpdateEffectPolicy(ctx, "wire.send", &p.Version, ratchet.PolicyUpdate{
		"mode":                ratchet.PolicyModeRequireApproval,
		"daily_budget_micros": 50_000_000,
	})
	switch {
	case ratchet.IsCode(err, ratchet.CodeVersionConflict):
		log.Print("the policy changed meanwhile: read it again and decide again")
	case ratchet.MayHaveApplied(err):
		log.Print("the answer was lost: read the policy to see whether it changed")
	case err != nil:
		log.Fatal(err)
	}
}

// An effect whose outcome is unknown (its lease lapsed without a report)
// blocks its key. Verify each at the vendor, then record what happened: the
// key then answers the vendor's result as a duplicate (OutcomeSucceeded), or
// may be tried again (OutcomeFailed).
func ExampleClient_ResolveEffect() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with an operator key
	// lookUp stands in for asking the vendor about the effect's key.
	lookUp := func(ctx context.Context, key string) (found bool, result any, err error) {
		return false, nil, ctx.Err()
	}

	page, err := client.ListEffects(ctx, ratchet.EffectQuery{State: ratchet.EffectIndeterminate, EffectType: "email.send"})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range page.Data {
		found, result, err := lookUp(ctx, e.IdempotencyKey)
		if err != nil {
			log.Fatal(err)
		}
		req := ratchet.ResolveRequest{Outcome: ratchet.OutcomeFailed, Note: "not at the vendor"}
		if found {
			req = ratchet.ResolveRequest{Outcome: ratchet.OutcomeSucceeded, Result: result, Note: "found at the vendor"}
		}
		if _, err := client.ResolveEffect(ctx, e.ID, req); err != nil {
			log.Fatal(err)
		}
	}
}

// A step exhausted by an outage can run again once the outage is over (an
// operator key with steps:replay). The preview says whether it may, and its
// Attempt keeps a retried replay to one.
func ExampleClient_Replay() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with an operator key
	stepID := "stp_1"

	preview, err := client.ReplayPreview(ctx, stepID)
	if err != nil {
		log.Fatal(err)
	}
	if !preview.Eligible {
		log.Fatalf("step %s cannot be replayed: %s", stepID, *preview.IneligibleReason)
	}
	res, err := client.Replay(ctx, stepID, ratchet.ReplayOptions{
		// An earlier attempt may have done its side effect without its
		// outcome being recorded: the replay does it again.
		AcknowledgeDuplicateRisk: true,
		MaxAttempts:              1,
		Reason:                   "provider outage over",
		ExpectedAttempt:          &preview.Attempt,
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Println("replayed", res.StepID)
}
