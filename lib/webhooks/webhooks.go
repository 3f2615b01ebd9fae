// Package webhooks manages subscriptions and delivers outbox events to them,
// signed and retried with backoff. Delivery is at least once: a receiver must
// deduplicate by the event id it is sent.
package webhooks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
)

// Webhook is a subscription as the API shows it.
type Webhook struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events" openapi:"itemEnum=effect.indeterminate|circuit.tripped|circuit.closed|approval.requested|approval.decided|reconciliation.due|run.finished|step.exhausted|step.replayed,notNull"` // 1-50, a NOT NULL column
	CreatedAt time.Time `json:"created_at"`
	// PreviousSecretExpiresAt is when the secret a rotation replaced stops
	// signing deliveries beside the current one (RotateSecret); null when
	// none signs. Once past, the sweeper clears it (ClearExpiredSecrets).
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	// Disabled says the subscription is disabled (Update): nothing is sent
	// to it meanwhile. DisabledAt is since when; null while it is enabled.
	Disabled   bool       `json:"disabled" jsonschema:"true while the subscription is disabled (PATCH with disabled: true): its pending deliveries are held, not sent and their attempts untouched, and the events recorded meanwhile are skipped, never sent to it; enabling it again sends the held ones and the events recorded from then on. A delivery held for as long as the server keeps events (EVENT_RETENTION_DAYS, counted from when it fell due; never when that is 0, events kept for ever) ends failed (last_error expired while disabled) and goes with its event, never sent"`
	DisabledAt *time.Time `json:"disabled_at" jsonschema:"when the subscription was disabled; null while it is enabled"`
	// SecretUnreadable says this instance cannot open the subscription's
	// signing secret (sealed with a key missing from its
	// RESULT_ENCRYPTION_KEY / RESULT_ENCRYPTION_KEYS, or damaged), as the
	// effect's result_unreadable says of a result: no delivery of it is
	// sent meanwhile (seal QA: only the sweeper's log said its deliveries
	// were held, and its owner, who reads the subscription, could not tell).
	SecretUnreadable bool `json:"secret_unreadable" jsonschema:"true when this server cannot decrypt the subscription's signing secret (sealed with an encryption key it is not configured with, or damaged so that it fails authentication): no delivery is signed with it meanwhile. Under a missing key its deliveries stay pending, their attempts untouched, until an instance that has the key sends them; a damaged secret cannot sign, so each attempt fails until the secret is rotated. false otherwise, and in a DELETE's answer: the delete erases the secret"`
}

// NewWebhook is a created subscription with its signing secret, shown once.
type NewWebhook struct {
	Webhook
	Secret string `json:"secret"`
}

// SecretOf names the subscription whose secret w shows: the answer kept
// for a create's or rotation's Idempotency-Key is linked to it
// (idempotency.Answer's Resource), and its delete erases that answer
// (sqlAbandon).
func (w NewWebhook) SecretOf() string { return w.ID }

// SecretKind is a subscription's: the answers kept before migration 0067
// that show its signing secret (a create's or rotation's NewWebhook) are
// linked to it by the sweeper (idempotency.SecretShownBy).
var SecretKind = idempotency.SecretKind{IDPrefix: ids.Webhook, SecretPrefix: secretPrefix}

// secretPrefix begins every signing secret.
const secretPrefix = "whsec_"

// Delivery is one attempt record of sending one event to one subscription.
type Delivery struct {
	ID             string     `json:"id"`
	EventID        string     `json:"event_id"`
	EventType      string     `json:"event_type" openapi:"enum=effect.indeterminate|circuit.tripped|circuit.closed|approval.requested|approval.decided|reconciliation.due|run.finished|step.exhausted|step.replayed"`
	State          string     `json:"state" openapi:"enum=pending|delivered|failed"`
	Attempts       int        `json:"attempts"`
	LastStatusCode *int       `json:"last_status_code"`
	LastError      *string    `json:"last_error" jsonschema:"why the last attempt failed, in a fixed phrase (never the receiver's answer or the error's own words): non-2xx response (last_status_code says which); for a send that got no answer connection refused, connection closed without an answer, timed out: no connection within 5s, timed out: no answer within 10s, DNS lookup of the host failed, TLS: the receiver's certificate is not trusted for its host, TLS handshake failed, answer's headers over 64 KiB (an answer whose headers pass 64 KiB), refused: not a public address (WEBHOOK_ALLOW_PRIVATE_NETWORKS) or request failed (anything else); invalid url when the stored url no longer makes a request; cannot open signing secret when the server could not decrypt the subscription's secret to sign with; webhook deleted when its subscription's delete ended it; expired while disabled when it was held, its subscription disabled, for as long as the server keeps events (EVENT_RETENTION_DAYS, counted from when it fell due), after which the sweeper deletes it with its event; event type unsubscribed when a PATCH took its event type out of the subscription's events; null after a success or before any attempt"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	CreatedAt      time.Time  `json:"created_at"`
	DeliveredAt    *time.Time `json:"delivered_at"`
}

// CreateRequest is the body of POST /api/v1/webhooks. Its tags restate
// validate's checks: events lists 1 to maxEventsListed names, repeats
// included, each one of events.Types.
type CreateRequest struct {
	URL    string   `json:"url" openapi:"maxLength=2000" jsonschema:"the receiver: an absolute https URL (http too when the server sets WEBHOOK_ALLOW_PRIVATE_NETWORKS=true) without credentials, white space or a fragment (#…, which is never sent), naming a host (no empty label: a dot at its start, or two in a row) and, if any, a port from 1 to 65535 (a colon with no port after it is refused). Unless the server sets WEBHOOK_ALLOW_PRIVATE_NETWORKS=true its host must be a public address: an IP literal or localhost is checked here, a host name after its DNS resolution at each delivery. A subscription stored with an http url before https was required keeps being delivered"`
	Events []string `json:"events" openapi:"required,minItems=1,maxItems=50,itemEnum=effect.indeterminate|circuit.tripped|circuit.closed|approval.requested|approval.decided|reconciliation.due|run.finished|step.exhausted|step.replayed"`
}

// Service stores subscriptions and sends deliveries.
type Service struct {
	pool   *pgxpool.Pool
	sealer *seal.Sealer
	now    func() time.Time
	client *http.Client
	// allowPrivate: receivers on non-public addresses are accepted.
	allowPrivate bool
	logger       *slog.Logger
	// dispatchBatch bounds one fan-out (dispatchBatch; tests lower it).
	dispatchBatch int
	// conns is the delivery passes' share of the pool: all of this
	// instance's passes together (the local server runs up to 8 at once)
	// claim and record on at most half the pool's connections, leaving at
	// least two, and on at least one (db.ShareSize), leaving the rest to
	// requests (Deliver).
	conns *db.Share
	// recordWait bounds how long an ended send's outcome waits for others
	// to record with it (recordWait; tests raise it).
	recordWait time.Duration
	// sendTimeout bounds how long a delivery waits for its receiver's
	// answer (sendTimeout; a test raises it, so that a receiver it holds
	// is not timed out whatever the machine's pace).
	sendTimeout time.Duration
	// heldSQL is reportHeld's statement (sqlHeld; a test breaks it).
	heldSQL string
}

// New returns a Service. allowPrivate permits receivers on loopback and
// private networks (tests, self-hosting); otherwise the dialer refuses them,
// so a webhook cannot be aimed at the service's own network. logger hears
// of signing secrets that cannot be opened (by webhook id only).
func New(pool *pgxpool.Pool, sealer *seal.Sealer, now func() time.Time, allowPrivate bool, logger *slog.Logger) *Service {
	// Postgres keeps microseconds: a write answers the time a read returns.
	clock := func() time.Time { return now().UTC().Truncate(time.Microsecond) }
	return &Service{pool: pool, sealer: sealer, now: clock, client: newClient(allowPrivate), allowPrivate: allowPrivate,
		logger: redact.Logger(logger), dispatchBatch: dispatchBatch, conns: db.ShareOf(pool), recordWait: recordWait, sendTimeout: sendTimeout,
		heldSQL: sqlHeld}
}

// validate checks the request. Unless allowPrivate, a receiver named by a
// non-public address (an IP literal, or localhost) is refused here rather
// than at every delivery; a host name is checked after its resolution, at
// each delivery (newClient), since what it resolves to can change. Unless
// allowPrivate, a receiver must take https too (checkURL).
func (r *CreateRequest) validate(allowPrivate bool) error {
	var pr apierr.Problems
	checkURL(&pr, r.URL, allowPrivate)
	checkEvents(&pr, r.Events)
	return pr.Err()
}

// checkURL adds what is wrong with a receiver's URL to pr: a create's and
// an update's check.
func checkURL(pr *apierr.Problems, raw string, allowPrivate bool) {
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		pr.Add("url", "is required")
	case strings.ContainsFunc(raw, unicode.IsSpace):
		// url.Parse takes a space in the path, a trailing one included,
		// and the client sends it as %20: a URL pasted with a space after
		// it was taken, and every delivery went to a path the receiver
		// does not serve (webhooks QA).
		pr.Add("url", "must not contain white space (percent-encode a space in it as %%20)")
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" || u.User != nil:
		// The host name, not Host: "http://:8080/" has a Host (":8080")
		// and no name, and the client dials it on this server's own
		// machine (QA: it was taken at creation).
		pr.Add("url", "must be an absolute http(s) URL without credentials")
	case len(raw) > 2000:
		pr.Add("url", "must be at most 2000 characters")
	case !validPort(u):
		// url.Parse takes any digits (QA: :99999 was taken, and every
		// delivery to it failed until its attempts ran out), and none.
		pr.Add("url", "must name a port from 1 to 65535, or none")
	case strings.Contains(raw, "#"):
		// The client never sends a fragment: a URL whose receiver reads
		// one (a token after "#") was taken, and every delivery reached
		// it without (webhooks QA). Refused, as Stripe refuses a malformed
		// endpoint URL, rather than stored as something it is not.
		pr.Add("url", "must not contain a fragment (#…): it is never sent to the receiver")
	case !allowPrivate && namesNonPublic(u.Hostname()):
		pr.Add("url", "must name a public address (receivers on loopback or private networks need "+
			"WEBHOOK_ALLOW_PRIVATE_NETWORKS=true)")
	case emptyLabel(u.Hostname()):
		// No resolver looks such a name up: every delivery failed, DNS
		// lookup of the host failed, until its attempts ran out (QA).
		pr.Add("url", "must name a host without an empty label (a dot at its start, or two in a row)")
	case !allowPrivate && u.Scheme != "https":
		// A delivery carries its event's details and a signature: over
		// plain http any network on the way reads them (and the
		// receiver cannot tell it reached the right host), so a public
		// receiver must take https, as Stripe requires of live
		// endpoints. Where private receivers are allowed (self-hosting,
		// tests) a loopback or in-network http receiver is normal, and
		// a host name cannot be told private before it resolves: http
		// is taken there. Only a create and a PATCH of url check it: a
		// subscription stored with an http url is still delivered.
		pr.Add("url", "must be an https URL (plain http receivers need WEBHOOK_ALLOW_PRIVATE_NETWORKS=true)")
	}
}

// checkEvents adds what is wrong with a subscription's event types to pr:
// a create's and an update's check.
func checkEvents(pr *apierr.Problems, evs []string) {
	if len(evs) == 0 {
		pr.Add("events", "must name at least one event type")
	}
	if len(evs) > maxEventsListed {
		// One problem, not one per item, each naming every type (QA: a
		// 67 KB list was answered with a 1 MB error).
		pr.Add("events", "must list at most %d event types", maxEventsListed)
		return
	}
	for i, e := range evs {
		if !slices.Contains(events.Types, e) {
			pr.Add(fmt.Sprintf("events.%d", i), "must be one of %s", strings.Join(events.Types, ", "))
		}
	}
}

// eventSet is a valid events list as a subscription stores it: sorted,
// each type once.
func eventSet(evs []string) []string {
	out := slices.Clone(evs)
	slices.Sort(out)
	return slices.Compact(out)
}

// abandoned is the last_error of a delivery its webhook's delete ended.
const abandoned = "webhook deleted"

// expiredWhileDisabled is the last_error of a delivery held while its
// webhook was disabled for longer than the events' retention (ExpireHeld).
const expiredWhileDisabled = "expired while disabled"

// unsubscribed is the last_error of a pending delivery an update ended by
// taking its event type out of the subscription's events.
const unsubscribed = "event type unsubscribed"

// maxEventsListed bounds a subscription's events list, repeats included.
const maxEventsListed = 50

// emptyLabel reports whether a host name, as the client dials it
// (asDialed), has an empty label: only dots, a dot at its start, or two in
// a row ("example.com..", "a..b", "."). One dot at its end, the root's,
// is none; an IPv6 literal has no labels.
func emptyLabel(host string) bool {
	host = asDialed(host)
	return !strings.Contains(host, ":") && slices.Contains(strings.Split(strings.TrimSuffix(host, "."), "."), "")
}

// validPort reports whether u names no port or one of 1-65535. A colon
// with nothing after it ("http://127.0.0.1:/") names no port either, and
// is refused as a bad one: url.Parse takes it and Port reads "", as for a
// URL without a colon (webhooks QA: it was taken, "a port of 1–65535, if
// any" said otherwise).
func validPort(u *url.URL) bool {
	port := u.Port()
	if port == "" {
		return !strings.HasSuffix(u.Host, ":")
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

// Create stores a subscription and returns its secret once.
func (s *Service) Create(ctx context.Context, workspaceID string, req CreateRequest) (NewWebhook, error) {
	if err := req.validate(s.allowPrivate); err != nil {
		return NewWebhook{}, err
	}
	var w NewWebhook
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		// Creates of one workspace take turns, so the count below sees
		// every one committed before (a statement's snapshot predates a
		// lock it waits for, hence two statements). A fan-out of the
		// workspace's events holds the lock shared (Dispatch): it waits
		// for a create in progress, and a create waits for it.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('webhooks:' || $1::text, 0))`,
			workspaceID); err != nil {
			return fmt.Errorf("lock webhooks: %w", err)
		}
		// The clock is read once the lock is held: read before a wait
		// for a fan-out, created_at came before events that fan-out took
		// without the webhook, which never got them (webhooks QA).
		now := s.now()
		w = NewWebhook{Webhook: Webhook{ID: ids.NewAt(ids.Webhook, now), URL: req.URL, Events: eventSet(req.Events),
			CreatedAt: now}, Secret: secretPrefix + ids.Random(32)}
		tag, err := tx.Exec(ctx, `INSERT INTO webhooks (id, workspace_id, url, events, secret, created_at)
			SELECT $1::text, $2::text, $3::text, $4::text[], $5::bytea, $6::timestamptz
			WHERE (SELECT count(*) FROM webhooks WHERE workspace_id = $2::text AND deleted_at IS NULL) < $7::int`,
			w.ID, workspaceID, w.URL, w.Events, s.sealer.Seal([]byte(w.Secret), seal.AAD(w.ID, "secret")), now,
			MaxWebhooks)
		if err != nil {
			return fmt.Errorf("insert webhook: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return apierr.InvalidState("A workspace holds at most %d webhooks; delete one first.", MaxWebhooks)
		}
		return nil
	})
	if err != nil {
		return NewWebhook{}, err
	}
	return w, nil
}

// MaxWebhooks bounds a workspace's live subscriptions: each event is sent
// to each of them, so without a bound one workspace's burst of events
// could fill every sweeper pass (see perWorkspace) and turn each API call
// into as many outbound requests as it liked (security review).
const MaxWebhooks = 20

// webhookCols are a Webhook's columns (all but SecretUnreadable, which a
// read derives: readCols), in its fields' order (Webhook.dest), as of the
// time in parameter now ("$3"): a previous secret that has stopped signing
// reads null, though the sweeper has not cleared it yet (review: its past
// time was shown).
func webhookCols(now string) string {
	return `id, url, events, created_at, ` + signingUntil(now) + `, disabled_at IS NOT NULL, disabled_at`
}

// dest are the scan destinations of webhookCols, in order.
func (w *Webhook) dest() []any {
	return []any{&w.ID, &w.URL, &w.Events, &w.CreatedAt, &w.PreviousSecretExpiresAt, &w.Disabled, &w.DisabledAt}
}

// signingUntil is until when the previous secret signs, as of the time in
// parameter now; null when it does not (none, or it stopped).
func signingUntil(now string) string {
	return `CASE WHEN previous_secret_expires_at > ` + now + `::timestamptz THEN previous_secret_expires_at END`
}

// readCols are webhookCols and the sealed signing secret, which a read
// opens for its secret_unreadable flag (readRows) and never answers.
func readCols(now string) string { return webhookCols(now) + `, secret` }

// readRows collects the subscriptions of a statement selecting readCols,
// each with SecretUnreadable: its secret opened, as the sweeper opens it to
// sign (a secret is some 70 bytes, a workspace holds at most MaxWebhooks),
// so that the flag covers a damaged secret as well as a missing key. A read
// that finds such secrets logs one line naming the first, its key id and
// how many (never a secret), as the effects' reads log their results. A
// deleted subscription has no secret (NULL, sqlDelete), which opens to
// nothing: false.
func (s *Service) readRows(rows pgx.Rows) ([]Webhook, error) {
	var (
		unreadable int
		first      string
		keyID      string
		firstErr   error
	)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Webhook, error) {
		var w Webhook
		var secret []byte
		if err := r.Scan(append(w.dest(), &secret)...); err != nil {
			return w, err
		}
		if _, err := s.sealer.Open(secret, seal.AAD(w.ID, "secret")); err != nil {
			w.SecretUnreadable = true
			if unreadable == 0 {
				first, keyID, firstErr = w.ID, seal.KeyIDOf(secret), err
			}
			unreadable++
		}
		return w, nil
	})
	if err != nil {
		return nil, err
	}
	if unreadable > 0 {
		s.logger.Warn("webhook signing secrets this instance cannot open read as secret_unreadable; their "+
			"deliveries are not sent by it", "count", unreadable, "webhook_id", first, "key_id", keyID, "err", firstErr)
	}
	return out, nil
}

// List pages through live subscriptions.
func (s *Service) List(ctx context.Context, workspaceID, cursor string, limit int) ([]Webhook, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+readCols("$4")+` FROM webhooks
		WHERE workspace_id = $1 AND deleted_at IS NULL AND id > $2 ORDER BY id LIMIT $3`, workspaceID, cursor, limit, s.now())
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	list, err := s.readRows(rows)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return list, nil
}

// Get reads one live subscription (never its secret); a deleted one is
// unknown, as in the list.
func (s *Service) Get(ctx context.Context, workspaceID, id string) (Webhook, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+readCols("$3")+` FROM webhooks
		WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL`, id, workspaceID, s.now())
	if err != nil {
		return Webhook{}, fmt.Errorf("read webhook: %w", err)
	}
	list, err := s.readRows(rows)
	if err != nil {
		return Webhook{}, fmt.Errorf("read webhook: %w", err)
	}
	if len(list) == 0 {
		return Webhook{}, apierr.NotFound("webhook")
	}
	return list[0], nil
}

// Delete ends a subscription; pending deliveries to it are abandoned, in the
// same transaction (review: a delete whose second statement failed left
// them pending for good, and a retried DELETE answered 404). A DELETE of a
// subscription already deleted answers it again, as a key's does, so a
// retry whose first answer was lost learns it landed (retry-safety QA).
//
// The delete erases the signing secrets (sqlDelete): nothing signs with
// them again, so kept sealed they were only a liability. The answers kept
// for its create's and rotations' Idempotency-Keys, which show a secret,
// are erased with them (sqlAbandon): a replay answers 404. It answers the
// subscription as the delete left it, without a secret (secret_unreadable
// false, previous_secret_expires_at null), so that a retried DELETE
// answers what the first one did.
func (s *Service) Delete(ctx context.Context, workspaceID, id string) (Webhook, error) {
	var w Webhook
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		// One statement locks, marks and answers the row. A DELETE that
		// waits for a concurrent one re-reads the row as that one left it
		// and still matches it (no deleted_at condition), so it answers it
		// too (review: an update of live rows only answered 404 there).
		rows, err := tx.Query(ctx, sqlDelete, id, s.now(), workspaceID)
		if err != nil {
			return fmt.Errorf("delete webhook: %w", err)
		}
		list, err := s.readRows(rows)
		if err != nil {
			return err
		}
		if len(list) == 0 {
			return pgx.ErrNoRows // unknown, or another workspace's
		}
		w = list[0]
		if _, err := tx.Exec(ctx, sqlAbandon, id, nil, abandoned); err != nil {
			return fmt.Errorf("abandon deliveries: %w", err)
		}
		return nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, apierr.NotFound("webhook")
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("delete webhook: %w", err)
	}
	return w, nil
}

// sqlDelete marks webhook $1 of workspace $3 deleted at $2 (kept when it
// already was, so a retried DELETE answers what the first did) and
// erases its signing secrets, current and previous, in the same statement:
// once deleted nothing signs with them (its pending deliveries end with the
// delete, a claim passes over deleted webhooks), and a reader of the table
// holding the sealing key could otherwise sign deliveries its receiver may
// still accept (migration 0065). It answers the row as a read shows it.
var sqlDelete = `
UPDATE webhooks SET deleted_at = coalesce(deleted_at, $2::timestamptz),
    secret = NULL, previous_secret = NULL, previous_secret_expires_at = NULL
WHERE id = $1::text AND workspace_id = $3::text
RETURNING ` + readCols("$2")

// sqlAbandon is a delete's second statement: it ends webhook $1's pending
// deliveries with last_error $3 ($2 NULL: sqlEndPending) and erases the
// answers kept for the Idempotency-Keys of its create and rotations, which
// show its secrets (migration 0067). It runs after sqlDelete, which locked the
// webhook's row, so its snapshot holds every such answer: a rotation holds
// the row from its update until it commits with its answer, and a delete
// that waited for it reads that answer here (in sqlDelete's statement,
// whose snapshot predates the wait, it would not); a rotation that comes
// later finds the webhook deleted and records nothing. A create commits the
// row and its answer together: a delete that finds the row finds the
// answer. Only answers recorded with the webhook named are erased: those
// an instance of the release before 0067 recorded go with their 24 hours.
var sqlAbandon = `
WITH erased AS (
    ` + idempotency.EraseAnswers("resource_id = $1::text") + `
)` + sqlEndPending

// UpdateRequest is the body of PATCH /api/v1/webhooks/{id}: each field sent
// changes the subscription, one left out keeps its value. At least one must
// be sent, none as null; url and events are checked as a create checks them.
type UpdateRequest struct {
	URL      jsonx.Optional[string]   `json:"url" openapi:"maxLength=2000,notNull" jsonschema:"the new receiver, checked as a create's url (https unless the server sets WEBHOOK_ALLOW_PRIVATE_NETWORKS=true; a PATCH that leaves url out keeps an http one stored before): the deliveries not yet sent (pending, or held while the subscription is disabled) go to it. A send already on its way when the change commits (at most 10s) may still reach the old one"`
	Events   jsonx.Optional[[]string] `json:"events" openapi:"notNull,minItems=1,maxItems=50,itemEnum=effect.indeterminate|circuit.tripped|circuit.closed|approval.requested|approval.decided|reconciliation.due|run.finished|step.exhausted|step.replayed" jsonschema:"the event types it subscribes to, in place of those it had: events fanned out from then on are matched against them, and its pending deliveries of a type no longer listed end failed (last_error event type unsubscribed)"`
	Disabled jsonx.Optional[bool]     `json:"disabled" openapi:"notNull" jsonschema:"true disables the subscription: its pending deliveries are held (not sent, attempts untouched; one held for as long as the server keeps events, EVENT_RETENTION_DAYS from when it fell due, ends failed, expired while disabled, and goes with its event; never when that is 0) and the events recorded while it is disabled are skipped, never sent to it. false enables it again: the held deliveries are sent, due at once if their time passed, and the events recorded from then on. Either one sent again changes nothing"`
}

// MinProperties is how many fields an update must send (the OpenAPI
// document states it).
func (UpdateRequest) MinProperties() int { return 1 }

// validate checks an update: at least one field, none null, url and
// events as a create's.
func (r *UpdateRequest) validate(allowPrivate bool) error {
	if !r.URL.Set && !r.Events.Set && !r.Disabled.Set {
		return apierr.InvalidField("body", "must name at least one of url, events and disabled")
	}
	var pr apierr.Problems
	for _, f := range []struct {
		name string
		null bool
	}{{"url", r.URL.Null}, {"events", r.Events.Null}, {"disabled", r.Disabled.Null}} {
		if f.null {
			pr.Add(f.name, "must not be null")
		}
	}
	if r.URL.Set && !r.URL.Null {
		checkURL(&pr, r.URL.Value, allowPrivate)
	}
	if r.Events.Set && !r.Events.Null {
		checkEvents(&pr, r.Events.Value)
	}
	return pr.Err()
}

// sqlUpdate changes live webhook $1 of workspace $2 at $6: its url to $3
// and its events to $4 (each NULL: kept), and disables it ($5 true: since
// $6, or since when it was already disabled) or enables it again ($5 false:
// the period it was disabled is kept as last_disabled, whose events the
// fan-out skips; NULL: kept). It answers the subscription as a read shows it.
// It runs once sqlLockUpdate holds the row, so that $6 is read after any
// wait for a concurrent delete, rotation, update or fan-out holding it; it
// applies to the row as that left it: a deleted one is not updated (404),
// a rotation's secret is kept.
var sqlUpdate = `
UPDATE webhooks SET
    url = coalesce($3::text, url),
    events = coalesce($4::text[], events),
    disabled_at = CASE WHEN $5::boolean THEN coalesce(disabled_at, $6::timestamptz)
        WHEN NOT $5::boolean THEN NULL ELSE disabled_at END,
    last_disabled = CASE WHEN NOT $5::boolean AND disabled_at IS NOT NULL
        THEN tstzrange(disabled_at, greatest(disabled_at, $6::timestamptz)) ELSE last_disabled END
WHERE id = $1::text AND workspace_id = $2::text AND deleted_at IS NULL
RETURNING ` + readCols("$6")

// sqlLockUpdate locks live webhook $1 of workspace $2 for an update
// (Update), after any transaction holding it: no row when it is unknown,
// another workspace's, or deleted (a delete it waited for included).
const sqlLockUpdate = `
SELECT true FROM webhooks WHERE id = $1::text AND workspace_id = $2::text AND deleted_at IS NULL
FOR NO KEY UPDATE`

// sqlEndPending ends webhook $1's pending deliveries with last_error $3:
// all of them (a delete, $2 null), or those of a type its events ($2) no
// longer list (an update). They are locked in id order first, as a retry
// and retention lock them (one order: no deadlock; a delete's bare UPDATE
// locked them in scan order). One being sent meanwhile is recorded
// delivered if it arrives (sqlRecord).
const sqlEndPending = `
UPDATE webhook_deliveries d SET state = 'failed', last_error = $3::text
FROM (
    SELECT id FROM webhook_deliveries
    WHERE webhook_id = $1::text AND state = 'pending' AND ($2::text[] IS NULL OR NOT event_type = ANY ($2::text[]))
    ORDER BY id
    FOR UPDATE
) x
WHERE d.id = x.id AND d.state = 'pending'`

// Update changes a subscription's url, its events, or whether it is
// disabled, in one transaction, and answers it as a read shows it; a
// deleted one is unknown (404), as to a rotation or a retry.
//
// The sweeper never writes a subscription's row, so nothing it does undoes
// an update; and each claim of deliveries reads the subscription as it is
// when the claim starts, so every claim that starts once the update has
// answered sends to the new url, and claims nothing while it is disabled.
// A send claimed before (sent at once, and at most sendTimeout long) may
// still reach the old url, or go out though the subscription is now
// disabled; its outcome is recorded as usual: a failure is retried at the
// new url, or held while it is disabled.
func (s *Service) Update(ctx context.Context, workspaceID, id string, req UpdateRequest) (Webhook, error) {
	if err := req.validate(s.allowPrivate); err != nil {
		return Webhook{}, err
	}
	var evs []string // nil: kept
	if req.Events.Set {
		evs = eventSet(req.Events.Value)
	}
	var w Webhook
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		// The row is held before the clock is read: read before the wait
		// for a concurrent enable, a disable recorded disabled_at before
		// that enable, and the events recorded between the two, while the
		// subscription was enabled, were skipped as recorded while it was
		// disabled (review).
		var live bool
		if err := tx.QueryRow(ctx, sqlLockUpdate, id, workspaceID).Scan(&live); errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("webhook")
		} else if err != nil {
			return fmt.Errorf("lock webhook: %w", err)
		}
		now := s.now()
		rows, err := tx.Query(ctx, sqlUpdate, id, workspaceID, req.URL.Ptr(), evs, req.Disabled.Ptr(), now)
		if err != nil {
			return fmt.Errorf("update webhook: %w", err)
		}
		list, err := s.readRows(rows)
		if err != nil {
			return fmt.Errorf("update webhook: %w", err)
		}
		if len(list) == 0 {
			return apierr.NotFound("webhook")
		}
		w = list[0]
		if evs != nil {
			if _, err := tx.Exec(ctx, sqlEndPending, id, evs, unsubscribed); err != nil {
				return fmt.Errorf("end unsubscribed deliveries: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Webhook{}, err
	}
	return w, nil
}

// RotateRequest is the body of POST /api/v1/webhooks/{id}/rotate-secret.
type RotateRequest struct {
	// PreviousSecretExpiresInSeconds is how long the secret being replaced
	// keeps signing deliveries beside the new one; 0 ends it at once.
	PreviousSecretExpiresInSeconds *int64 `json:"previous_secret_expires_in_seconds" openapi:"min=0,max=604800,default=86400"`
	// ReplacePrevious allows a rotation while an earlier one's previous
	// secret still signs: that secret then stops at once.
	ReplacePrevious bool `json:"replace_previous"`
}

// DefaultPreviousSecretTTL is how long a rotated secret keeps signing when
// the rotation does not say: a day, for receivers to take the new one.
const DefaultPreviousSecretTTL = 24 * time.Hour

// maxPreviousSecretTTL bounds it: a week.
const maxPreviousSecretTTL = 7 * 24 * time.Hour

// sqlRotateSecret gives live webhook $1 of workspace $2 the sealed secret
// $3; its current one becomes the previous, signing until $4 (NULL: not at
// all). An UPDATE's SET reads the row as it was, so previous_secret is the
// secret replaced. Only the latest two sign, so while a previous secret
// still signs at $5 (the one a receiver may still hold) it rotates only
// when $6 says to replace it. Answers the webhook, whether it rotated, and
// until when the previous secret it found signs.
var sqlRotateSecret = `
WITH w AS (
    SELECT id, ` + signingUntil("$5") + ` AS signing
    FROM webhooks WHERE id = $1::text AND workspace_id = $2::text AND deleted_at IS NULL
    FOR NO KEY UPDATE
), rotated AS (
    UPDATE webhooks SET secret = $3::bytea,
        previous_secret = CASE WHEN $4::timestamptz IS NULL THEN NULL ELSE secret END,
        previous_secret_expires_at = $4::timestamptz
    FROM w WHERE webhooks.id = w.id AND (w.signing IS NULL OR $6::boolean)
    RETURNING webhooks.id
)
SELECT ` + webhookCols("$5") + `, EXISTS (SELECT 1 FROM rotated), w.signing
FROM webhooks JOIN w USING (id)`

// RotateSecret gives a subscription a new signing secret, answered once.
// Deliveries sent from then on are signed with the new secret and, until
// the previous one expires, with that one too (two v1 signatures): a
// receiver moves to the new secret at its own pace, accepting a delivery
// when either signature verifies.
func (s *Service) RotateSecret(ctx context.Context, workspaceID, id string, req RotateRequest) (NewWebhook, error) {
	ttl := DefaultPreviousSecretTTL
	if v := req.PreviousSecretExpiresInSeconds; v != nil {
		if *v < 0 || *v > int64(maxPreviousSecretTTL/time.Second) {
			return NewWebhook{}, apierr.InvalidField("previous_secret_expires_in_seconds",
				"must be an integer from 0 to %d (a week)", int64(maxPreviousSecretTTL/time.Second))
		}
		ttl = time.Duration(*v) * time.Second
	}
	now := s.now()
	var expires *time.Time
	if ttl > 0 {
		t := now.Add(ttl)
		expires = &t
	}
	out := NewWebhook{Secret: secretPrefix + ids.Random(32)}
	var rotated bool
	var signing *time.Time
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		w := &out.Webhook
		return tx.QueryRow(ctx, sqlRotateSecret, id, workspaceID, s.sealer.Seal([]byte(out.Secret), seal.AAD(id, "secret")),
			expires, now, req.ReplacePrevious).Scan(append(w.dest(), &rotated, &signing)...)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return NewWebhook{}, apierr.NotFound("webhook")
	}
	if err != nil {
		return NewWebhook{}, fmt.Errorf("rotate webhook secret: %w", err)
	}
	if !rotated {
		// The receiver may still hold the previous secret (the new one was
		// not deployed yet, or its answer was lost): rotating would stop it
		// at once (review).
		return NewWebhook{}, apierr.InvalidState("A previous secret still signs until %s, beside the current one; "+
			"rotating now would stop it at once. Deploy the current secret and rotate after then, or send "+
			"replace_previous: true.", signing.UTC().Format(time.RFC3339)).
			WithDetail("previous_secret_expires_at", signing.UTC().Format(time.RFC3339Nano))
	}
	// The statement reads the row as it was before its update.
	out.PreviousSecretExpiresAt = expires
	return out, nil
}

// ClearExpiredSecrets removes up to limit previous secrets that stopped
// signing at or before now, so a rotated secret is not kept sealed in its
// row until the next rotation. A rotation that lands meanwhile sets a
// later expiry, and the update, rechecking the row at its newest version,
// leaves it. It also erases, up to limit, the secrets of deleted
// subscriptions that still hold them, and up to limit answers kept for an
// Idempotency-Key that show a deleted subscription's secret: a delete
// erases both itself (sqlDelete, sqlAbandon), but one by an instance of
// the release before migration 0065 (0067 for the answers), still running
// during the deploy, did not (found through webhooks_deleted_secret_idx
// and idempotent_requests_resource_idx, empty otherwise). The update
// rechecks, at the row's newest version, that it still holds a secret to
// clear: a pass racing another (sweepers of two instances) that waited on
// its row otherwise cleared it again and counted it twice (lib/app sweeper
// hammer). It answers how many rows it cleared, of both tables.
func (s *Service) ClearExpiredSecrets(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, sqlClearExpiredSecrets, now, limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("clear expired webhook secrets: %w", err)
	}
	return n, nil
}

// sqlClearExpiredSecrets is ClearExpiredSecrets' statement: $1 now, $2
// the limit.
var sqlClearExpiredSecrets = `
WITH cleared AS (
    UPDATE webhooks SET secret = CASE WHEN deleted_at IS NULL THEN secret END,
        previous_secret = NULL, previous_secret_expires_at = NULL
    WHERE id IN (
        (SELECT id FROM webhooks
         WHERE previous_secret IS NOT NULL AND previous_secret_expires_at <= $1::timestamptz
         LIMIT $2::int)
        UNION ALL
        (SELECT id FROM webhooks
         WHERE deleted_at IS NOT NULL AND (secret IS NOT NULL OR previous_secret IS NOT NULL)
         LIMIT $2::int)
    ) AND (previous_secret_expires_at <= $1::timestamptz
           OR deleted_at IS NOT NULL AND (secret IS NOT NULL OR previous_secret IS NOT NULL))
    RETURNING 1
), answers AS (
    ` + idempotency.EraseGoneAnswers("webhooks", "x.deleted_at IS NOT NULL", "$2::int") + `
    RETURNING 1
)
SELECT (SELECT count(*) FROM cleared) + (SELECT count(*) FROM answers)`

// deliveryCols are a delivery's columns (alias d) as the API shows it, in
// Delivery's order: the next attempt's time only while it is pending.
const deliveryCols = `d.id, d.event_id, d.event_type, d.state, d.attempts, d.last_status_code, d.last_error,
    CASE WHEN d.state = 'pending' THEN d.next_attempt_at END, d.created_at, d.delivered_at`

// RetryRequest is the body of POST /api/v1/webhooks/{id}/deliveries/retry.
type RetryRequest struct {
	DeliveryIDs []string `json:"delivery_ids" openapi:"required,minItems=1,maxItems=100"`
}

// Retried answers a retry: the deliveries it named, as they now are,
// newest first.
type Retried struct {
	Deliveries []Delivery `json:"deliveries" openapi:"notNull"` // each one named, at least one
}

// maxRetried bounds the deliveries one retry names.
const maxRetried = 100

// sqlRetryDeliveries sends deliveries ($3) of webhook $1 in workspace $2
// again: those that ended (delivered, or failed after their last attempt)
// become pending, due at $4, with their attempts starting over, as a new
// delivery's would. One that ended while a send of it is still in flight
// (its claim's hold, held_until, is live: a PATCH of the webhook's events
// ended it mid-send) is due only once that hold lapses, and keeps the
// hold, so that no claim sends it a second time while the first send is
// on its way; that send's record then decides (sqlRecord: delivered, or
// due again at once). Made due at $4, it was claimed and sent again beside
// the first send (webhooks review). A hold past its time (a sweeper that
// stopped mid-send) is cleared. A pending one keeps its schedule; one whose last
// attempt ($5) is in flight gets its attempts back, so that the attempt,
// should it fail, is not the last (review: the retry answered it pending,
// and its failure then ended it failed, never sent again). The rows are
// locked in id order first, as retention locks them (one order: no
// deadlock), and which to send again is decided by the rows as locked
// (named's state and attempts), never by the statement's snapshot: a claim
// committed while named waited for its lock counted the last attempt after
// that snapshot, whose row (attempts one short) the update passed over,
// and the retry answered the delivery pending with no attempt left, which
// then ended failed (hammer: TestRetriesRacingPassesKeepEachDeliveryGoing).
// A row the update takes is the one named locked (EvalPlanQual), so its
// SET reads the same. The webhook's row is held FOR SHARE, as a fan-out
// holds it: a Delete waits for the retry and then abandons the deliveries
// it made pending. It answers whether the webhook is live.
const sqlRetryDeliveries = `
WITH hook AS (
    SELECT id FROM webhooks WHERE id = $1::text AND workspace_id = $2::text AND deleted_at IS NULL
    FOR SHARE
), named AS (
    SELECT d.id, d.state, d.attempts FROM webhook_deliveries d JOIN hook ON d.webhook_id = hook.id
    WHERE d.id = ANY($3::text[])
    ORDER BY d.id
    FOR UPDATE OF d
), again AS (
    UPDATE webhook_deliveries d
    SET attempts = 0, state = 'pending',
        next_attempt_at = CASE WHEN named.state = 'pending' THEN d.next_attempt_at
            ELSE greatest($4::timestamptz, d.held_until) END,
        held_until = CASE WHEN named.state = 'pending' OR d.held_until > $4::timestamptz THEN d.held_until END,
        last_status_code = CASE WHEN named.state = 'pending' THEN d.last_status_code END,
        last_error = CASE WHEN named.state = 'pending' THEN d.last_error END,
        delivered_at = NULL
    FROM named WHERE d.id = named.id AND (named.state <> 'pending' OR named.attempts >= $5::int)
)
SELECT EXISTS (SELECT 1 FROM hook)`

// sqlNamedDeliveries reads deliveries ($2) of webhook $1 as the list
// shows them, after sqlRetryDeliveries (a statement of its own, so that it
// reads what a concurrent retry of the same ones left).
const sqlNamedDeliveries = `
SELECT ` + deliveryCols + ` FROM webhook_deliveries d
WHERE d.webhook_id = $1::text AND d.id = ANY($2::text[])
ORDER BY d.created_at DESC, d.id DESC`

// Retry sends deliveries of a subscription again, once its receiver is
// mended: each that ended (delivered, or failed after its last attempt)
// is pending again, due now, with its attempts starting over, or, when a
// send of it is still in flight (ended mid-send by a PATCH of the events),
// once that send's claim lapses (sqlRetryDeliveries): never sent twice at
// once; one still pending keeps its schedule (its attempts start over too
// if its last one is in flight). It answers the deliveries as they now
// are. Every id must name a delivery of this subscription (else 404, and
// nothing is sent again). Its event keeps its id: a receiver that
// deduplicates by it skips an event it had taken.
func (s *Service) Retry(ctx context.Context, workspaceID, webhookID string, req RetryRequest) (Retried, error) {
	var pr apierr.Problems
	switch n := len(req.DeliveryIDs); {
	case n == 0:
		pr.Add("delivery_ids", "must list at least one delivery id")
	case n > maxRetried:
		pr.Add("delivery_ids", "may list at most %d delivery ids", maxRetried)
	}
	wanted := map[string]bool{}
	lookup := make([]string, len(req.DeliveryIDs))
	for i, id := range req.DeliveryIDs {
		if wanted[id] {
			pr.Add(fmt.Sprintf("delivery_ids.%d", i), "is listed twice")
		}
		wanted[id] = true
		// An id that cannot be one is looked up as one of nothing, and
		// answered as such once the webhook is found (API.md §0).
		lookup[i] = ids.Lookup(ids.Delivery, id)
	}
	if err := pr.Err(); err != nil {
		return Retried{}, err
	}
	var out []Delivery
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		var live bool
		if err := tx.QueryRow(ctx, sqlRetryDeliveries, webhookID, workspaceID, lookup, s.now(),
			MaxAttempts).Scan(&live); err != nil {
			return fmt.Errorf("retry deliveries: %w", err)
		}
		if !live {
			return apierr.NotFound("webhook")
		}
		rows, err := tx.Query(ctx, sqlNamedDeliveries, webhookID, lookup)
		if err != nil {
			return fmt.Errorf("read retried deliveries: %w", err)
		}
		if out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Delivery]); err != nil {
			return fmt.Errorf("read retried deliveries: %w", err)
		}
		if len(out) != len(wanted) {
			// Rolled back: with an id of another webhook, or of none,
			// nothing is sent again.
			return apierr.NotFound("delivery")
		}
		return nil
	})
	if err != nil {
		return Retried{}, err
	}
	return Retried{Deliveries: out}, nil
}

// DeliveryCursor is the page cursor after d: deliveries page newest first
// by (created_at, id).
func DeliveryCursor(d Delivery) string {
	return d.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + d.ID
}

// sqlDeliveriesPage pages webhook $1's deliveries (of workspace $2, live)
// newest first: after the previous page's last ($3 created, $4 id; $3 null
// for the first page), $5 at most. The page is taken in a subquery, one
// range of webhook_deliveries_list_idx walked backwards from the cursor:
// ordered and limited outside the join, the statement read every delivery
// of the webhook and sorted them for each page (scale QA: 300,000
// deliveries, 10,900 buffers and 150-780 ms a page; 11 buffers with the
// range). The first page's bound is infinity rather than no bound, so that
// a generic plan still starts the range at the cursor. A live webhook with
// no deliveries (after the cursor) answers one row of nulls, an unknown or
// deleted one none.
const sqlDeliveriesPage = `
SELECT ` + deliveryCols + `
FROM webhooks w
LEFT JOIN LATERAL (
    SELECT * FROM webhook_deliveries d
    WHERE d.webhook_id = w.id
      AND (d.created_at, d.id) < (coalesce($3::timestamptz, 'infinity'), $4::text)
    ORDER BY d.created_at DESC, d.id DESC LIMIT $5::int
) d ON true
WHERE w.id = $1::text AND w.workspace_id = $2::text AND w.deleted_at IS NULL
ORDER BY d.created_at DESC, d.id DESC`

// ValidDeliveriesCursor says whether cursor can be a deliveries page's
// next_cursor ("" for the first page).
func ValidDeliveriesCursor(cursor string) bool {
	_, _, ok := deliveriesCursor(cursor)
	return cursor == "" || ok
}

// deliveriesCursor is the delivery a deliveries page's cursor follows, and
// whether it can be one: a time and a delivery's id. Any text after the
// bar was taken and compared as an id, so a mistyped cursor answered
// another page rather than 400 (QA; "…|" was read as no cursor).
func deliveriesCursor(cursor string) (time.Time, string, bool) {
	ts, id, ok := strings.Cut(cursor, "|")
	t, err := time.Parse(time.RFC3339Nano, ts)
	return t, id, ok && err == nil && ids.Valid(ids.Delivery, id)
}

// Deliveries pages through one subscription's deliveries, newest first.
func (s *Service) Deliveries(ctx context.Context, workspaceID, webhookID, cursor string, limit int) ([]Delivery, error) {
	var (
		after   *time.Time // nil: the first page
		afterID string
	)
	if cursor != "" {
		t, id, ok := deliveriesCursor(cursor)
		if !ok {
			return nil, apierr.InvalidField("cursor", "is not a cursor from this API")
		}
		after, afterID = &t, id
	}
	rows, err := s.pool.Query(ctx, sqlDeliveriesPage, webhookID, workspaceID, after, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	type row struct {
		ID             *string
		EventID        *string
		EventType      *string
		State          *string
		Attempts       *int32
		LastStatusCode *int32
		LastError      *string
		NextAttemptAt  *time.Time
		CreatedAt      *time.Time
		DeliveredAt    *time.Time
	}
	raw, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	if len(raw) == 0 {
		return nil, apierr.NotFound("webhook")
	}
	out := make([]Delivery, 0, len(raw))
	for _, r := range raw {
		if r.ID == nil { // the webhook exists but has no deliveries
			continue
		}
		d := Delivery{ID: *r.ID, EventID: *r.EventID, EventType: *r.EventType, State: *r.State,
			Attempts: int(*r.Attempts), LastError: r.LastError, NextAttemptAt: r.NextAttemptAt,
			CreatedAt: *r.CreatedAt, DeliveredAt: r.DeliveredAt}
		if r.LastStatusCode != nil {
			c := int(*r.LastStatusCode)
			d.LastStatusCode = &c
		}
		out = append(out, d)
	}
	return out, nil
}
