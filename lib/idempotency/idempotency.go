// Package idempotency keeps the answers of creates sent with an
// Idempotency-Key header, so that a client whose answer was lost (a timeout,
// a dropped connection) sends the same request again and gets the same
// answer instead of a second key, webhook or contract. Routes with an
// idempotency key of their own (begin, runs, steps, groups) do not need it.
//
// The first request claims the key in one statement and acts; its success
// is stored (sealed: a new key's secret is in it) and given again, byte for
// byte, to the same request (same method, path and body bytes) from the same
// API key for a day. The answer is recorded in the transaction that holds
// the request's work, so the two commit together (Stripe's atomic phases). A
// request that did nothing (refused, or rolled back) gives its claim up, so
// that the corrected request may use the key; another request under a
// stored key is refused, and any sent while the first is still acting is
// told to wait. A request whose COMMIT went unanswered finds out whether it
// landed (Settle), and gives the key up if it did not. A request that could
// not give its claim up or find that out for want of the database goes on
// trying once its answer is sent, until the database answers or the claim
// lapses. A request that died while acting holds the key until its claim
// lapses (ClaimTTL); the retry after that finds the answer if the commit
// landed, and acts if it did not.
package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/seal"
)

// Header is the request header that names the key.
const Header = "Idempotency-Key"

// TTL is how long an answer is kept and given again.
const TTL = 24 * time.Hour

// ActingTime bounds how long a live request acts under its claim: a
// route's timeout and StoreTimeout together (lib/httpapi checks every
// route that takes the header).
const ActingTime = 20 * time.Second

// ClaimTTL is how long a request acting under a key holds it: longer than
// ActingTime, so a claim lapses only when its request is gone.
const ClaimTTL = 30 * time.Second

// StoreTimeout bounds recording an answer and committing it with the
// route's work, and giving a claim up: the request's own deadline may be
// nearly spent by then (lib/httpapi gives them a time of their own).
const StoreTimeout = 5 * time.Second

var (
	// ErrReused is a key already used for another request (another route,
	// path or body).
	ErrReused = errors.New("idempotency: key used for another request")
	// ErrInFlight is a key whose first request is still acting
	// (*InFlightError says for how long at most).
	ErrInFlight = errors.New("idempotency: key's request in flight")
)

// InFlightError is ErrInFlight with the pause to take before asking again:
// a second while the claim's request may still be acting (its answer may
// come at any moment), then until the claim lapses, in whole seconds.
type InFlightError struct {
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string { return ErrInFlight.Error() }

// Is makes errors.Is(err, ErrInFlight) hold.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// inFlight is the InFlightError of a claim that lapses in remaining.
func inFlight(remaining time.Duration) error {
	if ClaimTTL-remaining < ActingTime {
		return &InFlightError{RetryAfter: time.Second}
	}
	whole := (remaining + time.Second - 1) / time.Second * time.Second // up to the next second
	return &InFlightError{RetryAfter: max(whole, time.Second)}
}

// Store keeps the answers.
type Store struct {
	pool   *pgxpool.Pool
	sealer *seal.Sealer
	now    func() time.Time
	// claimed, when set (tests), sees the claim statement's error first:
	// it may lose an answer the database gave.
	claimed func(error) error
}

// New returns a store over pool.
func New(pool *pgxpool.Pool, sealer *seal.Sealer, now func() time.Time) *Store {
	return &Store{pool: pool, sealer: sealer, now: now}
}

// Request is one request sent under a key.
type Request struct {
	APIKeyID string // the caller: keys are per API key
	Key      string // the header's value
	Method   string
	Path     string // the request's path, parameters included
	Body     []byte
	ID       string // unique to this request (its X-Request-Id)
}

// Answer is what a request answered.
type Answer struct {
	Status int
	Body   []byte
	// RequestID is the request that acted (on an answer given again).
	RequestID string
	// Resource, when set (Record), is the id of the resource whose secret
	// the answer shows (a new key's secret, a webhook's signing secret):
	// deleting (a key: revoking) it erases the answer (EraseAnswers), which
	// Begin then reports as an *ErasedError instead of giving it again.
	Resource string
}

// ErrErased is an answer erased with the resource whose secret it showed
// (EraseAnswers): the request is not acted on again, and its answer is
// not given (*ErasedError names the request that acted).
var ErrErased = errors.New("idempotency: answer erased with its resource")

// ErasedError is ErrErased with the request that acted.
type ErasedError struct {
	RequestID string
}

func (e *ErasedError) Error() string { return ErrErased.Error() }

// Is makes errors.Is(err, ErrErased) hold.
func (e *ErasedError) Is(target error) bool { return target == ErrErased }

// ErasedStatus is the status an erased answer keeps in its row: an
// instance of the release before migration 0067, which reads no erasure,
// gives it again with an empty body, a 404 rather than the success.
const ErasedStatus = 404

// EraseAnswers is a statement erasing the answers, among those linked to
// a resource (Answer.Resource), that match where (a condition on
// idempotent_requests' columns, resource_id: "resource_id = $1::text"):
// their sealed answer goes, and the row stays until its 24 hours end, so
// the same request is still not acted on again (Begin answers ErrErased)
// and another one under its key is still ErrReused. Run it in the
// transaction that deletes (a key: revokes) the resource, in a statement
// that starts once the resource's row is locked, so that it reads the
// answers committed until then: a request that recorded such an answer held that row (it
// created the resource, or changed its secret under its lock) until it
// committed with its answer.
func EraseAnswers(where string) string {
	return `UPDATE idempotent_requests SET answer = NULL, status = ` + strconv.Itoa(ErasedStatus) + `
    WHERE resource_id <> '' AND answer IS NOT NULL AND (` + where + `)`
}

// EraseGoneAnswers is a statement erasing up to limit (a SQL expression)
// answers linked to a resource of table (by its id column) that is gone:
// gone is a condition on its row, aliased x ("x.deleted_at IS NOT NULL").
// A sweeper task runs it for the answers the resource's delete (revoke)
// did not erase: those LinkAnswers linked after it, and those of a
// resource an instance of a release that erased none deleted.
// It reads idempotent_requests_resource_idx, the linked answers that
// still show a secret, whole. A row is erased only while it still names
// the gone resource it was chosen for: the update rechecks each row it
// meets at its newest version, but not the choice, made from the
// statement's snapshot. A key whose 24 hours ended is taken again in its
// row (Begin), and a create committed after that snapshot linked it to
// its own, live resource: matched by its key alone, that answer was erased
// (review: the live key's create, sent again, read 404 "revoked since").
func EraseGoneAnswers(table, gone, limit string) string {
	return EraseAnswers(`(key_id, idempotency_key, resource_id) IN (
        SELECT r.key_id, r.idempotency_key, r.resource_id FROM idempotent_requests r JOIN ` + table + ` x ON x.id = r.resource_id
        WHERE r.resource_id <> '' AND r.answer IS NOT NULL AND ` + gone + `
        LIMIT ` + limit + `)`)
}

// SecretKind is a kind of resource whose create (or rotation) answers its
// secret beside its id, at the top level of its JSON: its ids' prefix
// (lib/ids) and its secrets'. The prefixes of ids tell the kinds apart, so
// an answer linked by its resource's id (Answer.Resource) names one
// resource of one kind.
type SecretKind struct {
	IDPrefix     string
	SecretPrefix string
}

// SecretShownBy is the resource, of one of kinds, whose secret an answer
// body shows ("" when none): the sweeper links the answers that name
// nothing (kept before migrations 0067 and 0068) with it (LinkAnswers).
func SecretShownBy(kinds ...SecretKind) func(body []byte) string {
	return func(body []byte) string {
		var a struct {
			ID     string `json:"id"`
			Secret string `json:"secret"`
		}
		if json.Unmarshal(body, &a) != nil {
			return ""
		}
		for _, k := range kinds {
			if ids.Valid(k.IDPrefix, a.ID) && strings.HasPrefix(a.Secret, k.SecretPrefix) {
				return a.ID
			}
		}
		return ""
	}
}

// Claim is a key held by the request acting under it.
type Claim struct {
	s      *Store
	apiKey string
	key    string
	id     string    // the request's
	until  time.Time // when it lapses, by the store's clock
	taken  time.Time // when it was claimed, by this instance's (monotonic)
}

// Begin claims req's key for it, or returns the answer stored for the same
// request. It fails with ErrReused, an *InFlightError, or an *ErasedError
// for the same request whose answer was erased with its resource.
func (s *Store) Begin(ctx context.Context, req Request) (*Claim, *Answer, error) {
	hash := requestHash(req)
	// The claim and the read are two statements: a key claimed by a
	// request that committed after the claim's snapshot is seen only by a
	// later one. A row deleted between them (a claim given up, a purge)
	// makes the key free again, so the claim is tried anew.
	for range 3 {
		now := s.now()
		var claimed bool
		// The claim is not cancelled with its request: a client gone
		// mid-statement left a claim that landed after the give-up below
		// had run, holding the key for ClaimTTL (QA: a connection reset
		// right after sending). It runs to its end, and the caller, whose
		// context is done, fails at once and gives it up.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StoreTimeout)
		err := s.pool.QueryRow(cctx, sqlClaim, req.APIKeyID, req.Key, hash, req.ID, now.Add(ClaimTTL), now,
			now.Add(-TTL)).Scan(&claimed)
		cancel()
		if s.claimed != nil {
			err = s.claimed(err)
		}
		claim := &Claim{s: s, apiKey: req.APIKeyID, key: req.Key, id: req.ID, until: now.Add(ClaimTTL),
			taken: time.Now()}
		switch {
		case err == nil:
			return claim, nil, nil
		case !errors.Is(err, pgx.ErrNoRows):
			// The claim's answer was lost (the connection dropped, its
			// time ran out): it may have landed, and nothing will act
			// under it, so it is given up at once rather than holding the
			// key until it lapses (once the database is back, when it is
			// what failed: giveUpOrLater). At worst the give-up runs
			// before the claim lands, and the claim lapses as before.
			_ = claim.giveUpOrLater(ctx, lostClaimGiveUpTimeout)
			return nil, nil, fmt.Errorf("idempotency: claim: %w", err)
		}
		var stored, answer []byte
		var status *int
		var requestID string
		var claimedUntil *time.Time
		err = s.pool.QueryRow(ctx, sqlStored, req.APIKeyID, req.Key, now.Add(-TTL)).
			Scan(&stored, &requestID, &claimedUntil, &status, &answer)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("idempotency: read: %w", err)
		case status == nil && claimedUntil != nil:
			// Whatever the request: reuse would read as final, yet the
			// first may do nothing and free the key (chaos QA: a corrected
			// request told reuse acted later).
			return nil, nil, inFlight(claimedUntil.Sub(now))
		case string(stored) != string(hash):
			return nil, nil, ErrReused
		case status == nil:
			return nil, nil, fmt.Errorf("idempotency: row of key without answer or claim")
		case answer == nil:
			// Erased with the resource whose secret it showed.
			return nil, nil, &ErasedError{RequestID: requestID}
		}
		body, err := s.sealer.Open(answer, AnswerAAD(req.APIKeyID, req.Key))
		if err != nil {
			return nil, nil, fmt.Errorf("idempotency: open the answer kept for API key %s: %w", req.APIKeyID, err)
		}
		return nil, &Answer{Status: *status, Body: body, RequestID: requestID}, nil
	}
	// Claimed and given up three times over while this request looked:
	// the same key is being retried in a tight loop.
	return nil, nil, inFlight(time.Second)
}

// Record stores a, the success of the request holding the claim, in q: the
// transaction holding what the request did (db.BeginRequest), so that its
// work and its answer commit together or not at all, and a retry either
// gets the answer or acts on a clean slate. A claim taken over meanwhile (the
// request outlived ClaimTTL, and another took the key) is left to its new
// holder: taken reports it, and the caller must roll its work back.
// a.Resource links the answer to the resource whose secret it shows, in the
// same statement, so that the resource's delete erases it; an answer that
// shows none is recorded as such (an empty resource_id), so that LinkAnswers,
// which reads the answers recorded before migration 0067 (NULL), passes
// over it.
func (c *Claim) Record(ctx context.Context, q db.Querier, a Answer) (taken bool, err error) {
	sealed := c.s.sealer.Seal(a.Body, AnswerAAD(c.apiKey, c.key))
	tag, err := q.Exec(ctx, sqlAnswer, c.apiKey, c.key, c.id, a.Status, sealed, a.Resource)
	if err != nil {
		return false, fmt.Errorf("idempotency: record answer: %w", err)
	}
	return tag.RowsAffected() == 0, nil
}

// GiveUp frees the key of a request that did nothing (refused, or its
// transaction rolled back), so that the corrected request may use it. A
// request that may have committed keeps its claim instead, until it lapses.
// When the database cannot be reached, GiveUp answers that error and goes
// on trying in the background until the claim lapses (giveUpOrLater).
func (c *Claim) GiveUp(ctx context.Context) error {
	return c.giveUpOrLater(ctx, StoreTimeout)
}

// Pauses between a background give-up's tries (giveUpLater): from the
// first, doubling to the last.
const (
	laterGiveUpPause    = 100 * time.Millisecond
	laterGiveUpMaxPause = 2 * time.Second
)

// giveUpOrLater gives the claim up within timeout, and when that fails
// for want of the database (a crash, a restart, a cut network path) goes
// on trying in the background, pausing between tries, until it succeeds,
// fails otherwise, or the claim lapses by the store's clock or by ClaimTTL
// gone on this instance's (DB crash QA: a request that changed nothing
// but met the database down held its key until the claim lapsed, and a
// key's create sent again once the database was back two seconds later
// was told to wait for up to 30 s). Trying later is as safe as trying
// now: the give-up deletes the claim only while it is this request's and
// unanswered, after waiting for a transaction still holding its row to
// end, so it never frees the key of a request that committed. On a
// serverless instance frozen after its answer the tries wait for its next
// invocation, or the claim lapses first. It answers the first try's error.
func (c *Claim) giveUpOrLater(ctx context.Context, timeout time.Duration) error {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	err := c.giveUp(tctx)
	cancel()
	if err != nil && db.IsUnavailable(err) {
		go c.giveUpLater()
	}
	return err
}

// giveUpLater is giveUpOrLater's background tries.
func (c *Claim) giveUpLater() {
	for pause := laterGiveUpPause; ; pause = min(2*pause, laterGiveUpMaxPause) {
		time.Sleep(pause)
		if !c.s.now().Before(c.until) || time.Since(c.taken) >= ClaimTTL {
			return // lapsed: the key is free to the next request anyway
		}
		ctx, cancel := context.WithTimeout(context.Background(), StoreTimeout)
		err := c.giveUp(ctx)
		cancel()
		if err == nil || !db.IsUnavailable(err) {
			return
		}
	}
}

// SettleTimeout bounds Settle's wait for the transaction whose COMMIT went
// unanswered. One whose connection the server ended (pg_terminate_backend,
// a failover, a pooler dropping its server connection) is over at once; one
// whose network path died without a word may hold its row until the server
// notices, and the claim is then kept until it lapses.
const SettleTimeout = 2 * time.Second

// ErrUnsettled is a Settle that could not tell whether the transaction
// committed: the claim is kept until it lapses.
var ErrUnsettled = errors.New("idempotency: the outcome of the request's commit is unknown")

// Settle finds out whether the request transaction that recorded the
// claim's answer (Record) committed, when its COMMIT went unanswered (the
// connection ended while it was sent or answered; db.ErrCommitUnknown).
// That transaction holds the claim's row from Record until it ends, so a
// statement on another connection that waits for the row sees its end:
// rolled back (its connection ended before the commit), the claim is given
// up in that statement and landed is false, the request having changed
// nothing, and its retry acts at once; committed, landed is true, the
// answer and the work being recorded together. Before, such a request
// held its key until the claim lapsed (ClaimTTL): a worker's registration
// whose connection was ended at COMMIT waited 30 s (chaos QA). An error
// (ErrUnsettled, or the database's) leaves the outcome unknown, and the
// claim is kept until it lapses, or until its give-up, still waiting for
// the row when Settle stopped waiting (its cancel request is sent apart),
// finds the transaction rolled back: it never frees the key of one that
// committed. When the database could not be reached, the give-up is tried
// again in the background until the claim lapses (giveUpOrLater), with the
// same guarantee.
func (c *Claim) Settle(ctx context.Context) (landed bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SettleTimeout)
	defer cancel()
	tag, err := c.s.pool.Exec(ctx, sqlGiveUp, c.apiKey, c.key, c.id)
	if err != nil {
		if db.IsUnavailable(err) {
			go c.giveUpLater()
		}
		return false, fmt.Errorf("idempotency: settle claim: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return false, nil
	}
	// Not given up: the transaction committed its answer (read now, after
	// the wait, in a snapshot of its own), or the claim is no longer this
	// request's (taken over once it lapsed, or purged).
	var answered bool
	err = c.s.pool.QueryRow(ctx, sqlAnswered, c.apiKey, c.key, c.id).Scan(&answered)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && !answered):
		return false, ErrUnsettled
	case err != nil:
		return false, fmt.Errorf("idempotency: settle claim: %w", err)
	}
	return true, nil
}

// lostClaimGiveUpTimeout bounds giving up a claim whose answer was lost: a
// best effort, which must not hold the request's own answer (often a 503)
// for long when the database is what failed.
const lostClaimGiveUpTimeout = time.Second

func (c *Claim) giveUp(ctx context.Context) error {
	if _, err := c.s.pool.Exec(ctx, sqlGiveUp, c.apiKey, c.key, c.id); err != nil {
		return fmt.Errorf("idempotency: give up claim: %w", err)
	}
	return nil
}

// LinkAnswers links up to limit answers recorded without a word of the
// resource whose secret they show (by the release before migration 0067,
// before the upgrade or during its deploy; or, for a key's create, by the
// release of 0067, which 0068 made name nothing) as Record links them now:
// each is opened, and secretOf names the resource whose secret its body
// shows ("" when none; SecretShownBy). Its resource's delete (a key's revoke)
// then erases it; one whose resource was deleted already is left to the
// erasure of the answers of gone resources (EraseGoneAnswers: lib/webhooks
// ClearExpiredSecrets and lib/auth EraseRevokedAnswers, which the sweeper
// runs after it). An answer that cannot be opened here (sealed under a key
// this instance lacks) is left as it was, for an instance that has the key,
// or for its 24 hours to end; so is one a re-seal or a new claim changed
// meanwhile, for the next pass. One sealed under a key this instance has
// that fails authentication (damaged, or copied from another row) is linked
// as showing no secret: no key and no release opens it (the key id is the
// key's hash, and its associated data is its row's), so no request is ever
// answered it and a delete would erase nothing readable, while left
// unlinked it came first at every pass and a limit's worth held every
// later answer unlinked (review). Linked or not, its bytes stay until its
// 24 hours end. It answers how many it linked or found showing no secret.
func (s *Store) LinkAnswers(ctx context.Context, limit int, secretOf func(body []byte) string) (int, error) {
	rows, err := s.pool.Query(ctx, sqlUnlinked, limit, s.sealer.Headers())
	if err != nil {
		return 0, fmt.Errorf("idempotency: read unlinked answers: %w", err)
	}
	var apiKeys, keys, resources []string
	var answers [][]byte
	for rows.Next() {
		var apiKey, key string
		var answer []byte
		if err := rows.Scan(&apiKey, &key, &answer); err != nil {
			rows.Close()
			return 0, fmt.Errorf("idempotency: read unlinked answers: %w", err)
		}
		body, err := s.sealer.Open(answer, AnswerAAD(apiKey, key))
		resource := ""
		switch {
		case errors.Is(err, seal.ErrUnknownKey):
			continue // none is read (sqlUnlinked)
		case err == nil:
			resource = secretOf(body)
		}
		apiKeys, keys, answers = append(apiKeys, apiKey), append(keys, key), append(answers, answer)
		resources = append(resources, resource)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("idempotency: read unlinked answers: %w", err)
	}
	if len(keys) == 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, sqlLink, apiKeys, keys, answers, resources)
	if err != nil {
		return 0, fmt.Errorf("idempotency: link answers: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Purge deletes up to limit answers older than TTL before now.
func (s *Store) Purge(ctx context.Context, now time.Time, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, sqlPurge, now.Add(-TTL), limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// AnswerAAD is the associated data an answer is sealed with: its row's
// primary key (lib/reseal derives it so too).
func AnswerAAD(apiKeyID, key string) []byte { return seal.AAD(apiKeyID+"/"+key, "answer") }

// requestHash identifies a request: its method, path and body bytes. The
// bytes, not their meaning: the route decodes strictly, so two bodies that
// mean the same to a lenient reader (a repeated field, 6e1 for 60, invalid
// UTF-8) may be one the route refuses, which must not be answered with the
// other's success (QA).
func requestHash(req Request) []byte {
	h := sha256.New()
	for _, part := range []string{req.Method, req.Path} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(req.Body)
	return h.Sum(nil)
}

// $1 API key, $2 key, $3 request hash, $4 request id, $5 claimed until,
// $6 now, $7 oldest answer still given. A row older than that is a new key;
// an unanswered one whose claim lapsed is taken over by any request (its
// holder died, or failed not knowing whether it acted).
const sqlClaim = `
INSERT INTO idempotent_requests AS r (key_id, idempotency_key, request_hash, request_id, claimed_until, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (key_id, idempotency_key) DO UPDATE
SET request_hash = excluded.request_hash, request_id = excluded.request_id, claimed_until = excluded.claimed_until,
    status = NULL, answer = NULL, resource_id = NULL, created_at = excluded.created_at
WHERE r.created_at <= $7 OR (r.status IS NULL AND r.claimed_until <= $6)
RETURNING true`

// $1 API key, $2 key, $3 oldest answer still given.
const sqlStored = `
SELECT request_hash, request_id, claimed_until, status, answer FROM idempotent_requests
WHERE key_id = $1 AND idempotency_key = $2 AND created_at > $3`

// $1 API key, $2 key, $3 request id, $4 status, $5 sealed answer, $6 the
// resource whose secret it shows (empty: none).
const sqlAnswer = `
UPDATE idempotent_requests SET status = $4, answer = $5, claimed_until = NULL, resource_id = $6::text
WHERE key_id = $1 AND idempotency_key = $2 AND request_id = $3 AND status IS NULL`

// $1 API key, $2 key, $3 request id.
const sqlGiveUp = `
DELETE FROM idempotent_requests WHERE key_id = $1 AND idempotency_key = $2 AND request_id = $3 AND status IS NULL`

// $1 API key, $2 key, $3 request id.
const sqlAnswered = `
SELECT status IS NOT NULL FROM idempotent_requests WHERE key_id = $1 AND idempotency_key = $2 AND request_id = $3`

// sqlUnlinked reads up to $1 answers recorded before migration 0067
// (idempotent_requests_unlinked_idx), oldest first, of those sealed under
// a key this instance has ($2: seal.Sealer.Headers). Each pass reads the
// oldest again until it is linked: without the filter, a limit's worth
// sealed under a key the instance lacks, which it can never link, came
// first at every pass and held every later answer unlinked (review), its
// secret kept past its resource's delete for the rest of its day.
const sqlUnlinked = `
SELECT key_id, idempotency_key, answer FROM idempotent_requests
WHERE resource_id IS NULL AND answer IS NOT NULL AND substring(answer FROM 1 FOR 5) = ANY ($2::bytea[])
ORDER BY created_at LIMIT $1`

// sqlLink links each answer ($1 API keys, $2 keys, $3 the sealed answers
// read) to its resource ($4, empty for none), if the row still holds that
// answer unlinked.
const sqlLink = `
UPDATE idempotent_requests r SET resource_id = u.resource
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) AS u(key_id, idempotency_key, answer, resource)
WHERE r.key_id = u.key_id AND r.idempotency_key = u.idempotency_key AND r.answer = u.answer
  AND r.resource_id IS NULL`

// sqlPurge deletes up to $2 answers recorded at or before $1, oldest first
// (idempotent_requests_created_idx), by the row addresses the same
// statement locked, as sqlPruneCounters does in lib/auth: so a pass reads
// the rows it deletes. Deleted through a join on the key, each batch was
// planned as a hash of the batch probed by a scan of every answer kept
// (scale QA: 100,000 answers read for each batch of 1,000).
const sqlPurge = `
DELETE FROM idempotent_requests WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM idempotent_requests WHERE created_at <= $1
    ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))`
