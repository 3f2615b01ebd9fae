package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/webhooks"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// The SDK verifies what the server signs (webhooks.Sign), and nothing else:
// another body, secret or time, a malformed header.
func TestVerifyWebhookChecksTheServersSignature(t *testing.T) {
	t.Parallel()
	secret := "whsec_0123456789abcdef"
	body := []byte(`{"id":"evt_1","type":"run.finished","created_at":"2030-01-01T00:00:00Z",` +
		`"workspace_id":"ws_1","subject_id":"run_1","data":{"status":"SUCCEEDED"}}`)
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	sig := webhooks.Sign(at, body, secret)

	ev, err := ratchet.VerifyWebhookAt(secret, sig, body, 0, at.Add(4*time.Minute))
	require.NoError(t, err)
	require.Equal(t, "evt_1", ev.ID)
	require.Equal(t, "run.finished", ev.Type)
	require.Equal(t, "run_1", ev.SubjectID)
	require.JSONEq(t, `{"status":"SUCCEEDED"}`, string(ev.Data))
	_, err = ratchet.VerifyWebhookAt(secret, "v1=00,"+sig, body, 0, at)
	require.NoError(t, err, "any matching v1 will do")

	// No secret to check with verifies nothing, whatever was signed with it.
	_, err = ratchet.VerifyWebhookAt("", webhooks.Sign(at, body, ""), body, 0, at)
	require.ErrorIs(t, err, ratchet.ErrNoWebhookSecret)
	require.NotErrorIs(t, err, ratchet.ErrWebhookSignature, "a misconfiguration, not a forgery")

	for name, c := range map[string]struct {
		secret, sig string
		body        []byte
		now         time.Time
	}{
		"another body":         {secret, sig, []byte(strings.Replace(string(body), "SUCCEEDED", "FAILED", 1)), at},
		"another secret":       {"whsec_other", sig, body, at},
		"signed too long ago":  {secret, sig, body, at.Add(6 * time.Minute)},
		"signed in the future": {secret, sig, body, at.Add(-6 * time.Minute)},
		"no signature":         {secret, "", body, at},
		"no v1":                {secret, strings.Split(sig, ",")[0], body, at},
		"no time":              {secret, strings.Split(sig, ",")[1], body, at},
		"not hex":              {secret, strings.Split(sig, ",")[0] + ",v1=zz", body, at},
		"two times":            {secret, sig + ",t=1", body, at},
		"a huge header":        {secret, sig + strings.Repeat(",v1=00", 1000), body, at},
	} {
		_, err := ratchet.VerifyWebhookAt(c.secret, c.sig, c.body, 0, c.now)
		require.ErrorIs(t, err, ratchet.ErrWebhookSignature, name)
	}
	// A time out of tolerance is said the right way round, and one far out
	// of any (milliseconds sent for seconds) plainly (SDK QA: "signed
	// -6m40s from now", "-2562047h47m16.85s").
	_, err = ratchet.VerifyWebhookAt(secret, sig, body, 0, at.Add(-400*time.Second))
	require.ErrorContains(t, err, "signed 6m40s in the future")
	_, err = ratchet.VerifyWebhookAt(secret, sig, body, 0, at.Add(400*time.Second))
	require.ErrorContains(t, err, "signed 6m40s ago")
	millis := strings.Replace(sig, fmt.Sprintf("t=%d", at.Unix()), fmt.Sprintf("t=%d", at.UnixMilli()), 1)
	_, err = ratchet.VerifyWebhookAt(secret, millis, body, 0, at)
	require.ErrorContains(t, err, "not a time near now")
}

// A subscription made through the SDK receives an event the receiver
// verifies with the SDK; its deliveries read delivered, and it is deleted.
// Not parallel: it runs the global delivery pass.
func TestWebhooksThroughTheSDK(t *testing.T) {
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.WebhookAllowPrivateNetworks = true }))
	ctx := context.Background()
	var (
		mu       sync.Mutex
		received []*ratchet.WebhookEvent
		refused  []error // what the receiver refused, read by the test's goroutine
		secret   string
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		body, err := io.ReadAll(r.Body)
		if err == nil {
			var ev *ratchet.WebhookEvent
			ev, err = ratchet.VerifyWebhook(secret, r.Header.Get(ratchet.WebhookSignatureHeader), body)
			if err == nil && ev.ID != r.Header.Get(ratchet.WebhookEventIDHeader) {
				err = errors.New("the event id header names another event")
			}
			if err == nil {
				received = append(received, ev)
				return
			}
		}
		refused = append(refused, err)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(recv.Close)

	creator, lose := b.losingClient(t, b.ws.Key, "/webhooks")
	hook, err := creator.CreateWebhook(ctx, recv.URL, []string{ratchet.EventCircuitTripped})
	require.NoError(t, err)
	require.EqualValues(t, 2, lose.seen.Load(), "the first answer was lost and the call sent again")
	require.True(t, strings.HasPrefix(hook.Secret, "whsec_"), "the secret, once")
	mu.Lock()
	secret = hook.Secret
	mu.Unlock()
	list, err := b.operator.ListWebhooks(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	require.Equal(t, []ratchet.Webhook{hook.Webhook}, list.Data, "subscribed once")
	sameJSON(t, b, "/api/v1/webhooks", list)
	read, err := b.operator.GetWebhook(ctx, hook.ID)
	require.NoError(t, err)
	require.Equal(t, hook.Webhook, *read)

	_, err = b.operator.OpenCircuit(ctx, "sms.send", ratchet.BreakerDeny, "test")
	require.NoError(t, err)
	// The sweeps run a second ahead of this process's clock: the server
	// stamps events and retries with the database's clock (db.Clock), which
	// may read a millisecond past time.Now here, and a sweep at time.Now
	// then found nothing due (CI: the retried delivery was never sent).
	sweepTime := func() time.Time { return time.Now().Add(time.Second) }
	now := sweepTime()
	_, err = b.env.App.Server.Webhooks.Dispatch(ctx, now)
	require.NoError(t, err)
	_, err = b.env.App.Server.Webhooks.Deliver(ctx, now)
	require.NoError(t, err)
	mu.Lock()
	require.Empty(t, refused)
	require.Len(t, received, 1)
	require.Equal(t, "circuit.tripped", received[0].Type)
	require.Equal(t, b.ws.ID, received[0].WorkspaceID)
	mu.Unlock()
	deliveries, err := b.operator.ListWebhookDeliveries(ctx, hook.ID, ratchet.ListQuery{})
	require.NoError(t, err)
	require.Len(t, deliveries.Data, 1)
	require.Equal(t, ratchet.DeliveryDelivered, deliveries.Data[0].State)
	sameJSON(t, b, "/api/v1/webhooks/"+hook.ID+"/deliveries", deliveries)

	// Sent again on request, once, though the call's first answer is lost
	// and the delivery is sent before the call is sent again: that call,
	// under the first one's Idempotency-Key, is answered what the first
	// did, and sends nothing more.
	retrier, lostRetry := b.losingClient(t, b.ws.Key, "/deliveries/retry")
	lostRetry.lost = func() {
		_, err := b.env.App.Server.Webhooks.Deliver(ctx, sweepTime())
		require.NoError(t, err)
	}
	retried, err := retrier.RetryWebhookDeliveries(ctx, hook.ID, []string{deliveries.Data[0].ID})
	require.NoError(t, err)
	require.EqualValues(t, 2, lostRetry.seen.Load(), "the first answer was lost and the call sent again")
	require.Len(t, retried, 1)
	require.Equal(t, ratchet.DeliveryPending, retried[0].State, "the first call's answer")
	require.Zero(t, retried[0].Attempts)
	_, err = b.env.App.Server.Webhooks.Deliver(ctx, sweepTime())
	require.NoError(t, err)
	mu.Lock()
	require.Len(t, received, 2, "sent once more")
	require.Equal(t, received[0].ID, received[1].ID, "under the same event id")
	mu.Unlock()

	// Rotated, though the call's first answer is lost: one new secret, and
	// both verify a delivery until the previous one expires.
	rotator, lostRotate := b.losingClient(t, b.ws.Key, "/rotate-secret")
	hour := time.Hour - time.Millisecond // rounded up to the hour
	rotated, err := rotator.RotateWebhookSecret(ctx, hook.ID, ratchet.RotateSecretOptions{PreviousExpiresIn: &hour})
	require.NoError(t, err)
	require.EqualValues(t, 2, lostRotate.seen.Load())
	require.NotEqual(t, hook.Secret, rotated.Secret)
	require.NotNil(t, rotated.PreviousSecretExpiresAt)
	require.WithinDuration(t, time.Now().Add(time.Hour), *rotated.PreviousSecretExpiresAt, time.Minute)
	require.Equal(t, rotated.PreviousSecretExpiresAt, rotated.Webhook.PreviousSecretExpiresAt, "both fields say it")
	var sig string
	var sent []byte
	seen := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		sig = r.Header.Get(ratchet.WebhookSignatureHeader)
		sent, _ = io.ReadAll(r.Body)
	}))
	t.Cleanup(seen.Close)
	moved, err := b.operator.UpdateWebhook(ctx, hook.ID, ratchet.WebhookUpdate{URL: &seen.URL})
	require.NoError(t, err)
	require.Equal(t, seen.URL, moved.URL)
	require.Equal(t, hook.Events, moved.Events, "kept")
	_, err = b.operator.RetryWebhookDeliveries(ctx, hook.ID, []string{deliveries.Data[0].ID})
	require.NoError(t, err)
	_, err = b.env.App.Server.Webhooks.Deliver(ctx, sweepTime())
	require.NoError(t, err)
	mu.Lock()
	for _, secret := range []string{hook.Secret, rotated.Secret} {
		_, err := ratchet.VerifyWebhook(secret, sig, sent)
		require.NoError(t, err, "either secret verifies")
	}
	mu.Unlock()
	_, err = b.operator.UpdateWebhook(ctx, hook.ID, ratchet.WebhookUpdate{URL: &recv.URL})
	require.NoError(t, err)

	// Disabled, it is read disabled, and enabled again.
	off, on := true, false
	disabled, err := b.operator.UpdateWebhook(ctx, hook.ID, ratchet.WebhookUpdate{Disabled: &off})
	require.NoError(t, err)
	require.True(t, disabled.Disabled)
	require.NotNil(t, disabled.DisabledAt)
	sameJSON(t, b, "/api/v1/webhooks/"+hook.ID, disabled)
	read, err = b.operator.GetWebhook(ctx, hook.ID)
	require.NoError(t, err)
	require.Equal(t, disabled, read)
	enabled, err := b.operator.UpdateWebhook(ctx, hook.ID, ratchet.WebhookUpdate{Disabled: &on})
	require.NoError(t, err)
	require.False(t, enabled.Disabled)
	require.Nil(t, enabled.DisabledAt)

	// Every read shows until when the previous secret signs.
	read, err = b.operator.GetWebhook(ctx, hook.ID)
	require.NoError(t, err)
	require.Equal(t, rotated.PreviousSecretExpiresAt, read.PreviousSecretExpiresAt)
	gone, err := b.operator.DeleteWebhook(ctx, hook.ID)
	require.NoError(t, err)
	// Answered as the delete left it: its secrets erased, none signs.
	require.NotNil(t, read.PreviousSecretExpiresAt)
	require.Nil(t, gone.PreviousSecretExpiresAt)
	read.PreviousSecretExpiresAt = nil
	require.Equal(t, *read, *gone)
	list, err = b.operator.ListWebhooks(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, list.Data)

	// Under the caller's own key, asking again recovers the same
	// subscription and secret.
	kept, err := b.operator.CreateWebhookWithKey(ctx, recv.URL, []string{ratchet.EventRunFinished}, "hook:recoverable")
	require.NoError(t, err)
	again, err := b.operator.CreateWebhookWithKey(ctx, recv.URL, []string{ratchet.EventRunFinished}, "hook:recoverable")
	require.NoError(t, err)
	require.Equal(t, kept, again)
	_, err = b.operator.DeleteWebhook(ctx, kept.ID)
	require.NoError(t, err)
}

// WebhookHandler answers each delivery as the server's retries need: 204
// once handled, 500 (sent again later) when handling failed, 401 to what
// does not verify, 400 to what cannot be read, 405 to anything but a POST.
func TestWebhookHandlerAnswersEachDelivery(t *testing.T) {
	t.Parallel()
	secret := "whsec_handler"
	body := []byte(`{"id":"evt_2","type":"step.exhausted","created_at":"2030-01-01T00:00:00Z",` +
		`"workspace_id":"ws_1","subject_id":"stp_1","data":{"jobId":"job_1","runId":"run_1","attempt":3,"leaseLapsed":false,` +
		`"synthetic":false}}`)
	var handled []string
	failing := false
	h := ratchet.WebhookHandler(secret, func(_ context.Context, ev *ratchet.WebhookEvent) error {
		if failing {
			return errors.New("database down")
		}
		handled = append(handled, ev.ID)
		return nil
	})
	deliver := func(h http.Handler, method string, body []byte, sig string) int {
		t.Helper()
		r := httptest.NewRequest(method, "/ratchet", strings.NewReader(string(body)))
		if sig != "" {
			r.Header.Set(ratchet.WebhookSignatureHeader, sig)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	now := time.Now()
	require.Equal(t, http.StatusNoContent, deliver(h, "POST", body, webhooks.Sign(now, body, secret)))
	require.Equal(t, []string{"evt_2"}, handled)
	failing = true
	require.Equal(t, http.StatusInternalServerError, deliver(h, "POST", body, webhooks.Sign(now, body, secret)))
	failing = false

	require.Equal(t, http.StatusUnauthorized, deliver(h, "POST", body, webhooks.Sign(now, body, "whsec_other")))
	require.Equal(t, http.StatusUnauthorized, deliver(h, "POST", body, ""))
	require.Equal(t, http.StatusUnauthorized, deliver(h, "POST", body, webhooks.Sign(now.Add(-time.Hour), body, secret)))
	unset := ratchet.WebhookHandler("", func(context.Context, *ratchet.WebhookEvent) error { return nil })
	require.Equal(t, http.StatusUnauthorized, deliver(unset, "POST", body, webhooks.Sign(now, body, "")))
	notJSON := []byte("not json")
	require.Equal(t, http.StatusBadRequest, deliver(h, "POST", notJSON, webhooks.Sign(now, notJSON, secret)))
	// Webhooks QA: a signed null was handled as an event with no id.
	null := []byte("null")
	require.Equal(t, http.StatusBadRequest, deliver(h, "POST", null, webhooks.Sign(now, null, secret)))
	huge := []byte(strings.Repeat(" ", 1<<20+1))
	require.Equal(t, http.StatusBadRequest, deliver(h, "POST", huge, webhooks.Sign(now, huge, secret)))
	require.Equal(t, http.StatusMethodNotAllowed, deliver(h, "GET", nil, ""))
	require.Equal(t, []string{"evt_2"}, handled, "nothing else was handled")
}
