package ratchet_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// An agent's side effect through the effect gate: DoEffect asks before
// acting, runs the action only on execute (heartbeating its lease), reports
// what happened, and answers a repeat of the key with the recorded result
// instead of acting again. The key is derived from the work and blinded, as
// the recorded result (a refund id) is not for whoever can guess the order
// id.
func ExampleDoEffect() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with an AGENT key (RATCHET_AGENT_KEY)

	type refund struct {
		RefundID string `json:"refund_id"`
	}
	// errRefusedBeforeActing and issueRefund stand in for the vendor's SDK.
	errRefusedBeforeActing := errors.New("vendor: invalid amount")
	issueRefund := func(ctx context.Context, order string, cents int) (refund, error) {
		return refund{RefundID: "re_1"}, ctx.Err()
	}

	order := "order_551"
	// The same secret, kept in the environment, for every run: a new one
	// blinds a new key, and the refund would be issued again.
	secret := os.Getenv("RATCHET_BLIND_SECRET")
	if secret == "" {
		log.Fatal("RATCHET_BLIND_SECRET is not set")
	}
	key := ratchet.BlindKey(secret, "refund:"+order+":full")

	out, err := ratchet.DoEffect(ctx, client, ratchet.BeginRequest{
		EffectType:     "refund.issue",
		IdempotencyKey: key,
		Payload:        map[string]any{"order": order, "amount_cents": 12_500},
		CostMicros:     ratchet.Micros(125_000_000), // $125, counted against the type's budgets
	}, func(ctx context.Context, lease ratchet.Lease) (refund, error) {
		// ctx ends if the lease is lost: honour it.
		res, err := issueRefund(ctx, order, 12_500)
		if errors.Is(err, errRefusedBeforeActing) {
			return refund{}, ratchet.NotPerformed(err) // surely did not happen: reported failed
		}
		return res, err // any other error reports nothing: the outcome is honestly unknown
	})

	var (
		approval *ratchet.ApprovalRequiredError
		denied   *ratchet.DeniedError
		blocked  *ratchet.BlockedError
	)
	switch {
	case err == nil && out.Duplicate:
		fmt.Println("refunded earlier:", out.Result.RefundID) // the action did not run again
	case err == nil:
		fmt.Println("refunded:", out.Result.RefundID)
	case out != nil:
		// The refund was issued, but its record is in doubt: its report was
		// refused or its answer lost (err says whether the gate may have
		// recorded it), or its result was not stored (ErrResultNotStored).
		log.Printf("refund of effect %s issued: %v", out.EffectID, err)
	case errors.As(err, &approval):
		fmt.Println("waiting for an operator to decide", approval.ApprovalID) // then call again
	case errors.As(err, &denied):
		fmt.Println("denied:", denied.Code) // a budget, a policy, a breaker: do not work around it
	case errors.As(err, &blocked):
		fmt.Println("a prior attempt's outcome is unknown: check the vendor, then resolve effect", blocked.EffectID)
	case errors.Is(err, ratchet.ErrInFlight):
		fmt.Println("another caller is refunding this order right now")
	default:
		log.Fatal(err)
	}
}

// BlindKey is hex HMAC-SHA-256 of the key under a secret, first 32
// characters: deterministic, so a retry finds the recorded result, but not
// guessable from the order id. Read the secret from the environment; the
// literal here only makes the output checkable.
func ExampleBlindKey() {
	fmt.Println(ratchet.BlindKey("YOUR_SECRET", "refund:order_551:full"))
	// Output:
	// f241db595ef043342a1ce7c8df205f1d
}
