package ratchet

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Webhook is a subscription of a URL to event types (POST /api/v1/webhooks,
// scope webhooks:write).
type Webhook struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	CreatedAt time.Time `json:"created_at"`
	// PreviousSecretExpiresAt is when the secret the last rotation
	// replaced stops signing beside the current one (nil: none does;
	// the server clears a past one within a sweep).
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	// Disabled is true while the subscription is disabled (UpdateWebhook):
	// nothing is sent to it, its pending deliveries wait, and the events
	// recorded meanwhile are never sent to it. DisabledAt is since when
	// (nil while it is enabled).
	Disabled   bool       `json:"disabled"`
	DisabledAt *time.Time `json:"disabled_at"`
	// SecretUnreadable is true when the server cannot decrypt the
	// subscription's signing secret (sealed with an encryption key it is
	// not configured with, or damaged): no delivery is sent with it
	// meanwhile (under a missing key they wait, pending, for the key; a
	// damaged secret's attempts fail until RotateWebhookSecret).
	SecretUnreadable bool `json:"secret_unreadable"`
}

// NewWebhook is a created subscription with its signing secret, shown
// once: keep it where the receiver reads it (VerifyWebhook).
type NewWebhook struct {
	Webhook
	Secret string `json:"secret"` // the signing secret: shown only in this answer
}

// WebhookDelivery is the record of sending one event to one subscription.
type WebhookDelivery struct {
	ID        string `json:"id"`
	EventID   string `json:"event_id"`   // the WebhookEvent's ID
	EventType string `json:"event_type"` // one of the Event* constants
	State     string `json:"state"`      // DeliveryPending, DeliveryDelivered or DeliveryFailed
	Attempts  int    `json:"attempts"`   // sends so far
	// LastStatusCode is the receiver's status to the last send (nil when it
	// got no answer, or before any send).
	LastStatusCode *int `json:"last_status_code"`
	// LastError says why the last send failed, in a fixed phrase ("non-2xx
	// response", "connection refused", ...), never the receiver's answer;
	// nil after a success or before any send.
	LastError     *string    `json:"last_error"`
	NextAttemptAt *time.Time `json:"next_attempt_at"` // when a pending delivery is sent next
	CreatedAt     time.Time  `json:"created_at"`
	DeliveredAt   *time.Time `json:"delivered_at"` // when the receiver answered 2xx
}

// CreateWebhook subscribes url to events (the Event* constants). Every
// attempt of the call carries one Idempotency-Key, so a retry after a lost
// answer gets the subscription (and the secret) the first attempt made
// instead of a second one.
func (c *Client) CreateWebhook(ctx context.Context, url string, events []string) (*NewWebhook, error) {
	return c.CreateWebhookWithKey(ctx, url, events, newRequestID())
}

// CreateWebhookWithKey is CreateWebhook under an Idempotency-Key of the
// caller's (at most 255 characters): the same call with the same key within
// a day answers the same subscription and secret, so a caller whose
// retries ran out can still recover the secret, shown only here. Once the
// subscription is deleted the server erases that answer: the same call
// then fails with CodeNotFound (and creates nothing).
func (c *Client) CreateWebhookWithKey(ctx context.Context, url string, events []string, idempotencyKey string) (*NewWebhook, error) {
	body := struct {
		URL    string   `json:"url"`
		Events []string `json:"events"`
	}{url, events}
	return callKeyed[NewWebhook](ctx, c, "POST", "/webhooks", idempotencyKey, body)
}

// GetWebhook reads one subscription.
func (c *Client) GetWebhook(ctx context.Context, webhookID string) (*Webhook, error) {
	return call[Webhook](ctx, c, "GET", "/webhooks/"+pathID(webhookID), nil, idempotent)
}

// ListWebhooks pages the workspace's subscriptions.
func (c *Client) ListWebhooks(ctx context.Context, q ListQuery) (*GatePage[Webhook], error) {
	return call[GatePage[Webhook]](ctx, c, "GET", withQuery("/webhooks", q.values()), nil, idempotent)
}

// DeleteWebhook removes a subscription; its pending deliveries end failed.
// Deleting it again answers it again, so the call is retried.
func (c *Client) DeleteWebhook(ctx context.Context, webhookID string) (*Webhook, error) {
	return call[Webhook](ctx, c, "DELETE", "/webhooks/"+pathID(webhookID), nil, idempotent)
}

// WebhookUpdate is what UpdateWebhook changes: each field set, the others
// keep their value. Set at least one.
type WebhookUpdate struct {
	// URL is the new receiver (checked as CreateWebhook's): every delivery
	// not yet sent goes to it. A send already on its way when the change
	// lands (at most 10 s) may still reach the old one.
	URL *string
	// Events replace the event types subscribed to (nil keeps them; an
	// empty list is refused): the events fanned out from then on are
	// matched against them, and pending deliveries of a type left out end
	// failed ("event type unsubscribed").
	Events []string
	// Disabled disables the subscription (true: its pending deliveries wait,
	// at most as long as the server keeps events, EVENT_RETENTION_DAYS, then
	// end failed "expired while disabled"; the events recorded meanwhile are
	// never sent to it) or enables it
	// again (false: the waiting deliveries are sent, and the events recorded
	// from then on); nil keeps it as it is.
	Disabled *bool
}

// UpdateWebhook changes a subscription without deleting it, so it keeps
// its signing secret and its deliveries (PATCH /api/v1/webhooks/{id}), and
// answers it as GetWebhook reads it. It is retried under an
// Idempotency-Key of its own, so that a retry after a lost answer never
// undoes another update made since (a disable retried after an enable).
func (c *Client) UpdateWebhook(ctx context.Context, webhookID string, u WebhookUpdate) (*Webhook, error) {
	return c.UpdateWebhookWithKey(ctx, webhookID, u, "")
}

// UpdateWebhookWithKey is UpdateWebhook under an Idempotency-Key of the
// caller's (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) UpdateWebhookWithKey(ctx context.Context, webhookID string, u WebhookUpdate,
	idempotencyKey string) (*Webhook, error) {
	body := struct {
		URL      *string   `json:"url,omitempty"`
		Events   *[]string `json:"events,omitempty"`
		Disabled *bool     `json:"disabled,omitempty"`
	}{URL: u.URL, Disabled: u.Disabled}
	if u.Events != nil {
		body.Events = &u.Events
	}
	return callKeyed[Webhook](ctx, c, "PATCH", "/webhooks/"+pathID(webhookID), idempotencyKey, body)
}

// ListWebhookDeliveries pages a subscription's deliveries: each one's state,
// attempts and last status.
func (c *Client) ListWebhookDeliveries(ctx context.Context, webhookID string, q ListQuery) (*GatePage[WebhookDelivery], error) {
	path := withQuery("/webhooks/"+pathID(webhookID)+"/deliveries", q.values())
	return call[GatePage[WebhookDelivery]](ctx, c, "GET", path, nil, idempotent)
}

// RetryWebhookDeliveries sends deliveries of a subscription again (1 to
// 100, by id), once its receiver is mended: each that ended (failed after
// its last attempt, or delivered) is pending again, due at once, its
// attempts starting over, under the same event id; one still pending keeps
// its schedule. It answers the deliveries as they now are. Every attempt of
// the call carries one Idempotency-Key, so a retry after a lost answer does
// not send them a second time.
func (c *Client) RetryWebhookDeliveries(ctx context.Context, webhookID string, deliveryIDs []string) ([]WebhookDelivery, error) {
	return c.RetryWebhookDeliveriesWithKey(ctx, webhookID, deliveryIDs, "")
}

// RetryWebhookDeliveriesWithKey is RetryWebhookDeliveries under an
// Idempotency-Key of the caller's (at most 255 characters): the same retry
// under the same key within a day answers what the first did instead of
// sending the deliveries again.
func (c *Client) RetryWebhookDeliveriesWithKey(ctx context.Context, webhookID string, deliveryIDs []string,
	idempotencyKey string) ([]WebhookDelivery, error) {
	body := struct {
		DeliveryIDs []string `json:"delivery_ids"`
	}{deliveryIDs}
	out, err := callKeyed[struct {
		Deliveries []WebhookDelivery `json:"deliveries"`
	}](ctx, c, "POST", "/webhooks/"+pathID(webhookID)+"/deliveries/retry", idempotencyKey, body)
	if err != nil {
		return nil, err
	}
	return out.Deliveries, nil
}

// RotatedWebhook is a subscription with its new signing secret, shown
// once, and when the previous secret stops signing (nil: it already has).
// Its own PreviousSecretExpiresAt (kept from 0.4.5, so code that builds the
// type compiles) and the subscription's are the same time.
type RotatedWebhook struct {
	NewWebhook
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

// RotateSecretOptions shape RotateWebhookSecret.
type RotateSecretOptions struct {
	// PreviousExpiresIn is how long the secret being replaced keeps signing
	// beside the new one, rounded up to whole seconds, up to a week; nil
	// for the server's default (a day), 0 to end it at once.
	PreviousExpiresIn *time.Duration
	// ReplacePrevious rotates even while an earlier rotation's previous
	// secret still signs (the server refuses otherwise, 409 invalid_state,
	// as the receiver may still hold it): that secret stops at once.
	ReplacePrevious bool
	// IdempotencyKey is the Idempotency-Key the rotation is sent under (at
	// most 255 characters): the same rotation under the same key within a
	// day answers the secret the first made, so a caller whose retries ran
	// out can still recover it. Empty sends a fresh key of its own.
	IdempotencyKey string
}

// RotateWebhookSecret gives a subscription a new signing secret. Until the
// previous one expires deliveries are signed with both, so deploy the new
// secret to the receiver meanwhile: VerifyWebhook accepts a delivery when
// any of its signatures verifies. Every attempt of the call carries one
// Idempotency-Key, so a retry after a lost answer gets the secret the first
// attempt made.
func (c *Client) RotateWebhookSecret(ctx context.Context, webhookID string, opts RotateSecretOptions) (*RotatedWebhook, error) {
	body := struct {
		Seconds         *int64 `json:"previous_secret_expires_in_seconds,omitempty"`
		ReplacePrevious bool   `json:"replace_previous,omitempty"`
	}{ReplacePrevious: opts.ReplacePrevious}
	if d := opts.PreviousExpiresIn; d != nil {
		seconds := int64((*d + time.Second - 1) / time.Second)
		if *d <= 0 {
			seconds = 0
		}
		body.Seconds = &seconds
	}
	out, err := callKeyed[RotatedWebhook](ctx, c, "POST", "/webhooks/"+pathID(webhookID)+"/rotate-secret", opts.IdempotencyKey, body)
	if err != nil {
		return nil, err
	}
	// The outer field shadows the subscription's in decoding: both say it.
	out.Webhook.PreviousSecretExpiresAt = out.PreviousSecretExpiresAt
	return out, nil
}

// Event types a webhook subscribes to.
const (
	EventEffectIndeterminate = "effect.indeterminate"
	EventCircuitTripped      = "circuit.tripped"
	EventCircuitClosed       = "circuit.closed"
	EventApprovalRequested   = "approval.requested"
	EventApprovalDecided     = "approval.decided"
	EventReconciliationDue   = "reconciliation.due"
	EventRunFinished         = "run.finished"
	EventStepExhausted       = "step.exhausted"
	EventStepReplayed        = "step.replayed"
)

// Delivery states.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Headers of a webhook delivery.
const (
	WebhookSignatureHeader = "Ratchet-Signature" // t=<unix>,v1=<hex HMAC-SHA-256>
	WebhookEventIDHeader   = "Ratchet-Event-Id"
)

// DefaultWebhookTolerance is how far a delivery's signed time may be from
// the receiver's clock: every attempt is signed as it is sent, so a
// delivery captured and replayed later fails.
const DefaultWebhookTolerance = 5 * time.Minute

// WebhookEvent is what a delivery carries: ids and states, never payloads.
type WebhookEvent struct {
	ID          string    `json:"id"`   // the same in every attempt: deduplicate by it
	Type        string    `json:"type"` // one of the Event* constants
	CreatedAt   time.Time `json:"created_at"`
	WorkspaceID string    `json:"workspace_id"`
	// SubjectID is what the event is about: an effect, run, step,
	// approval, effect type or endpoint ("*" for the emergency stop).
	SubjectID string `json:"subject_id"`
	// Data is the event's own JSON object: ids and states (a run's status,
	// say), never payloads.
	Data json.RawMessage `json:"data"`
}

// ErrWebhookSignature is VerifyWebhook's answer to a delivery whose
// signature is missing, malformed, wrong or outside the tolerance.
var ErrWebhookSignature = errors.New("ratchet: webhook signature does not verify")

// ErrNoWebhookSecret is VerifyWebhook's answer when the receiver has no
// secret to check with (an unset variable, say): with an empty key anyone
// could sign, so nothing is accepted. It is a misconfiguration, not a
// forged delivery, so it does not match ErrWebhookSignature.
var ErrNoWebhookSecret = errors.New("ratchet: no webhook secret to verify with")

// maxSignatureHeader bounds the Ratchet-Signature header read, and
// maxSignatures the v1 entries in it (the server sends one, two while a
// rotated secret still signs).
const (
	maxSignatureHeader = 4096
	maxSignatures      = 8
)

// VerifyWebhook checks a delivery's Ratchet-Signature header (signature)
// over its raw body with the subscription's secret (without the ASCII white
// space around it: a secret read from a file with its line end verifies),
// refuses a signed time
// more than DefaultWebhookTolerance from now, and decodes the event. Read
// body whole and unmodified before calling it (no re-encoding: the
// signature is over the bytes sent). A verified body is read as the Python
// and TypeScript SDKs read it, strictly (decodeWebhookEvent): anything but
// one plain JSON object with the event's fields typed as they are is an
// error that does not match ErrWebhookSignature. Errors match
// ErrWebhookSignature for a delivery that is not Ratchet's. A header sent
// as several lines is read joined by commas, as WebhookHandler and the
// Python and TypeScript SDKs read it (two signatures are two t, refused):
//
//	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
//	ev, err := ratchet.VerifyWebhook(secret, strings.Join(r.Header.Values(ratchet.WebhookSignatureHeader), ","), body)
//	if errors.Is(err, ratchet.ErrWebhookSignature) { w.WriteHeader(http.StatusUnauthorized); return }
func VerifyWebhook(secret, signature string, body []byte) (*WebhookEvent, error) {
	return VerifyWebhookAt(secret, signature, body, DefaultWebhookTolerance, time.Now())
}

// webhookSecretSpace is the white space read off the ends of a secret:
// ASCII's, none of which a secret the server makes holds (whsec_ and hex
// digits).
const webhookSecretSpace = " \t\n\v\f\r"

// VerifyWebhookAt is VerifyWebhook at now, with a tolerance of its own
// (DefaultWebhookTolerance when 0).
func VerifyWebhookAt(secret, signature string, body []byte, tolerance time.Duration, now time.Time) (*WebhookEvent, error) {
	// A secret read from a file with its line end, or pasted with spaces
	// around it, verified no delivery at all: its ASCII white space is not
	// the secret's, as in the Python and TypeScript SDKs.
	secret = strings.Trim(secret, webhookSecretSpace)
	if secret == "" {
		return nil, ErrNoWebhookSecret
	}
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	invalid := fmt.Errorf("%w: malformed %s", ErrWebhookSignature, WebhookSignatureHeader)
	if len(signature) > maxSignatureHeader {
		return nil, invalid
	}
	var (
		ts     string
		signed [][]byte
	)
	for _, part := range strings.Split(signature, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, invalid
		}
		switch k {
		case "t":
			if ts != "" {
				return nil, invalid // two times: which one was signed is ambiguous
			}
			ts = v
		case "v1":
			mac, err := hex.DecodeString(v)
			if err != nil || len(signed) == maxSignatures {
				return nil, invalid
			}
			signed = append(signed, mac)
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(signed) == 0 {
		return nil, invalid
	}
	// A timestamp beyond what a Duration holds (one in milliseconds, say)
	// is as far off as any: said so, not as an overflowed duration.
	const farSeconds = 1 << 32
	if unix > now.Unix()+farSeconds || unix < now.Unix()-farSeconds {
		return nil, fmt.Errorf("%w: its timestamp is not a time near now (seconds since 1970)", ErrWebhookSignature)
	}
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance {
		return nil, fmt.Errorf("%w: signed %s ago, beyond %s", ErrWebhookSignature, d.Round(time.Second), tolerance)
	} else if d < -tolerance {
		return nil, fmt.Errorf("%w: signed %s in the future, beyond %s", ErrWebhookSignature, (-d).Round(time.Second), tolerance)
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	want := m.Sum(nil)
	for _, mac := range signed {
		if hmac.Equal(mac, want) {
			// Read as the Python and TypeScript SDKs read it
			// (decodeWebhookEvent): json.Unmarshal took null as an event
			// with no id, "ID" as id, and a name twice as its last.
			return decodeWebhookEvent(body)
		}
	}
	return nil, fmt.Errorf("%w: no v1 signature matches", ErrWebhookSignature)
}

// maxWebhookBody bounds what WebhookHandler reads of a delivery: an event
// carries ids and states only, far below it.
const maxWebhookBody = 1 << 20

// WebhookHandler is an http.Handler for a webhook receiver: it reads the
// delivery (up to 1 MiB), verifies it with secret (VerifyWebhook) and calls
// handle with the event. It answers 401 to a delivery that does not verify
// (and to every one while secret is empty or white space), 400 to an
// unreadable one, 500 when handle fails, so that Ratchet sends it again
// later, and 204 when handle succeeds. Delivery is at least once: handle
// should deduplicate by the event's ID.
func WebhookHandler(secret string, handle func(ctx context.Context, ev *WebhookEvent) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Every line of the header, joined as Node joins a repeated header
		// (the TypeScript SDK reads it so, and the Python SDK a list of
		// lines): two signatures sent as two lines are two t, refused as
		// ambiguous, where reading the first line only verified it.
		ev, err := VerifyWebhook(secret, strings.Join(r.Header.Values(WebhookSignatureHeader), ","), body)
		switch {
		case errors.Is(err, ErrWebhookSignature), errors.Is(err, ErrNoWebhookSecret):
			w.WriteHeader(http.StatusUnauthorized)
			return
		case err != nil: // signed by Ratchet but not an event this SDK reads
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if err := handle(r.Context(), ev); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
