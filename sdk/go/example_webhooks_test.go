package ratchet_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"time"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// A receiver verifies each delivery before trusting it: the signature is
// over the raw body, so read it whole and unmodified. Here the handler
// answers a delivery signed as Ratchet signs one (HMAC-SHA-256 of
// "<unix time>.<body>" under the subscription's secret) and a forged one.
func ExampleVerifyWebhook() {
	// The subscription's secret, shown once by CreateWebhook: read it from
	// the environment (RATCHET_WEBHOOK_SECRET, say), never from source.
	secret := "whsec_example"

	receive := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ev, err := ratchet.VerifyWebhook(secret, strings.Join(r.Header.Values(ratchet.WebhookSignatureHeader), ","), body)
		if err != nil { // ErrWebhookSignature: not Ratchet's, or replayed; ErrNoWebhookSecret: no secret set
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		// Delivery is at least once: deduplicate by ev.ID. ev.Data holds ids
		// and states only.
		fmt.Println("verified", ev.ID, ev.Type, ev.SubjectID)
		w.WriteHeader(http.StatusNoContent)
	}

	body := `{"id":"evt_1","type":"step.exhausted","created_at":"2030-01-01T00:00:00Z","workspace_id":"ws_1","subject_id":"stp_1","data":{"jobId":"job_1","runId":"run_1","attempt":3,"leaseLapsed":false,"synthetic":false}}`
	t := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(t + "." + body))
	for _, signature := range []string{
		"t=" + t + ",v1=" + hex.EncodeToString(mac.Sum(nil)),
		"t=" + t + ",v1=" + strings.Repeat("0", 64),
	} {
		req := httptest.NewRequest(http.MethodPost, "/ratchet", strings.NewReader(body))
		req.Header.Set(ratchet.WebhookSignatureHeader, signature)
		rec := httptest.NewRecorder()
		receive(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// verified evt_1 step.exhausted stp_1
	// 204
	// 401
}

// VerifyWebhookAt verifies at a time of your choosing (a test's fixed
// clock, here that of the shared vector in sdk/webhook_vectors.json) and
// with a tolerance of your own.
func ExampleVerifyWebhookAt() {
	secret := "whsec_0123456789abcdef" // the vector's; read yours from the environment
	signature := "t=1893456000,v1=ff237afee107becf95cba2d80d49da679041b19a8a9e4d9668eddeaf3701df21"
	body := []byte(`{"id":"evt_1","type":"run.finished","created_at":"2030-01-01T00:00:00Z","workspace_id":"ws_1","subject_id":"run_1","data":{"status":"SUCCEEDED"}}`)
	signedAt := time.Unix(1893456000, 0)

	ev, err := ratchet.VerifyWebhookAt(secret, signature, body, time.Minute, signedAt.Add(30*time.Second))
	fmt.Println(ev.ID, ev.Type, ev.SubjectID, string(ev.Data), err)

	// Ten minutes later the same delivery is a replay.
	_, err = ratchet.VerifyWebhookAt(secret, signature, body, 0, signedAt.Add(10*time.Minute))
	fmt.Println(errors.Is(err, ratchet.ErrWebhookSignature))
	// Output:
	// evt_1 run.finished run_1 {"status":"SUCCEEDED"} <nil>
	// true
}

// WebhookHandler does the reading and verifying: it calls handle with each
// verified event and answers 204 once handled, 500 when handle fails
// (Ratchet sends the delivery again later), 401 to what does not verify.
func ExampleWebhookHandler() {
	// record stands in for your idempotent store of events.
	record := func(ctx context.Context, id, typ, subject string) error { return ctx.Err() }

	http.Handle("/ratchet", ratchet.WebhookHandler(os.Getenv("RATCHET_WEBHOOK_SECRET"),
		func(ctx context.Context, ev *ratchet.WebhookEvent) error {
			return record(ctx, ev.ID, ev.Type, ev.SubjectID) // idempotent by ev.ID
		}))
	log.Fatal(http.ListenAndServe(":8790", nil))
}

// Subscribe to events (a key with webhooks:write). The signing secret is
// shown once, in this answer: store it where the receiver reads it, and
// never log it.
func ExampleClient_CreateWebhook() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with an operator key
	// store stands in for your secret store.
	store := func(webhookID, secret string) error { return nil }

	hook, err := client.CreateWebhook(ctx, "https://example.com/ratchet",
		[]string{ratchet.EventStepExhausted, ratchet.EventApprovalRequested})
	if err != nil {
		log.Fatal(err)
	}
	if err := store(hook.ID, hook.Secret); err != nil {
		log.Fatal(err)
	}
}

// UpdateWebhook (PATCH /api/v1/webhooks/{id}) changes a subscription in
// place, keeping its secret and its deliveries: each field set is changed,
// the others kept. Disable it for a receiver's maintenance window (its
// deliveries wait, and the events recorded meanwhile are skipped), then
// enable it again, here with another event list.
func ExampleClient_UpdateWebhook() {
	ctx := context.Background()
	var client *ratchet.Client // NewClient with a key with webhooks:write
	webhookID := "whk_1"

	disabled := true
	if _, err := client.UpdateWebhook(ctx, webhookID, ratchet.WebhookUpdate{Disabled: &disabled}); err != nil {
		log.Fatal(err)
	}

	enabled := false
	hook, err := client.UpdateWebhook(ctx, webhookID, ratchet.WebhookUpdate{
		Disabled: &enabled,
		Events:   []string{ratchet.EventStepExhausted, ratchet.EventRunFinished}, // replaces the list
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Println(hook.ID, hook.Events, hook.Disabled)
}
