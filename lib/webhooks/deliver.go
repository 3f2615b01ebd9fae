package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/text/unicode/norm"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/sweep"
)

const (
	// MaxAttempts bounds retries of one delivery: its eleven waits (Backoff)
	// add up to about 14.5 hours.
	MaxAttempts = 12
	// dispatchBatch bounds one sweeper pass, deliverBatch one round of
	// deliveries (Deliver); perWebhook bounds one webhook's sends in
	// flight, every pass's and instance's (sqlClaim), so that a receiver with a backlog (slow, or down and retried)
	// cannot hold other webhooks' deliveries, another workspace's included,
	// behind it.
	dispatchBatch = 500
	deliverBatch  = 100
	perWebhook    = 20
	// perWorkspace bounds one workspace's sends in flight (its share of a
	// round included) the same way, whatever its number of webhooks, so that other workspaces' events are sent in the same round
	// (security review: 300 webhooks of one workspace delayed another's by
	// minutes). A round takes turns among the workspaces (claim).
	perWorkspace = 40
	// maxRounds bounds the rounds of one pass (Deliver): a burst of up to
	// maxRounds × perWebhook events to one webhook goes out in one pass.
	maxRounds = 25
	// maxInFlight bounds the sends one pass has in flight; roundWait is how
	// long a round waits for its slowest receivers before the next round
	// claims for the others (Deliver).
	maxInFlight = deliverBatch // as many as one round ever sent at once: each ends with a record
	roundWait   = time.Second
	// claimHold keeps a claimed delivery invisible to other sweepers while it
	// is being sent, and counted in flight (held_until, sqlClaim); longer
	// than sendTimeout.
	claimHold   = 60 * time.Second
	sendTimeout = 10 * time.Second
	// connectTimeout bounds opening the connection, within sendTimeout.
	connectTimeout = 5 * time.Second
	// recordTimeout bounds recording an outcome, which runs even when the
	// pass's own time is up.
	recordTimeout = 5 * time.Second
	// recordWait is the longest an ended send's outcome waits for the
	// pass's other sends to end, so that their outcomes are recorded in one
	// statement (pass.record): a round's sends to receivers that answer
	// alike end within moments of each other, and up to 100 outcomes took
	// a statement and a checkout of the pass's share of the pool each.
	recordWait = 20 * time.Millisecond
)

// Backoff is the wait after failed attempt n (1-based): 30 s doubling, capped
// at 6 h, with ±20% jitter.
func Backoff(n int) time.Duration {
	d := 30 * time.Second << min(n-1, 10)
	if d > 6*time.Hour {
		d = 6 * time.Hour
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// Sign returns the Ratchet-Signature header value for body at t:
// t=<unix>,v1=<hex hmac-sha256(secret, "<t>.<body>")>, with one v1 per
// secret (a rotated secret signs beside the new one until it expires).
func Sign(t time.Time, body []byte, secrets ...string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	out := "t=" + ts
	for _, secret := range secrets {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(ts))
		m.Write([]byte("."))
		m.Write(body)
		out += ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	return out
}

// sqlDispatchPick picks and locks a fan-out's batch: up to $1 events to
// fan out, answering each one's id and workspace.
//
// The batch takes turns among the workspaces with events to fan out
// (db.FairPick), each one's oldest first: in creation order alone, one
// workspace's burst (100,000 run.finished of a bulk import) filled every
// pass until it was fanned out, and every other workspace's events, and
// so its webhooks, waited behind it for 200 passes (multi-tenant QA). The
// workspaces are found through events_undispatched_ws_idx (migration
// 0062), a descent each, and each one's oldest $1 are read from it.
var sqlDispatchPick = `
SELECT id, workspace_id FROM events
WHERE dispatched_at IS NULL AND id = ANY(ARRAY(` + db.FairPick(db.Backlog{
	Table: "events", Where: "dispatched_at IS NULL", Order: "created_at", Due: "created_at",
}, "$1::int") + `))
FOR UPDATE SKIP LOCKED`

// sqlDispatchWait waits for the webhook creates in progress in each
// workspace ($1, sorted) of a fan-out's batch: it takes the lock each
// create holds (Create) in its shared form, so fan-outs never wait for
// each other, and holds it until the fan-out commits, so a create that
// comes meanwhile waits for the fan-out instead, and reads its clock, its
// created_at, once the batch is fanned out. In one order (sorted): a
// fan-out never holds one workspace's lock while it waits, behind a
// create, for another that a second fan-out holding the first one waits
// for.
const sqlDispatchWait = `
SELECT count(pg_advisory_xact_lock_shared(hashtextextended('webhooks:' || ws, 0))) FROM unnest($1::text[]) ws`

// sqlDispatch fans out the batch's events ($2, locked by sqlDispatchPick)
// at $1, in a statement of its own after sqlDispatchWait, so that its
// snapshot holds every webhook whose create that waited for. It holds each
// webhook it fans out to FOR SHARE: a Delete (an UPDATE of that row) waits
// for it and then abandons the deliveries it made. Without the lock a
// fan-out whose snapshot predated the delete committed its delivery after
// the delete had abandoned the pending ones, and it stayed pending for
// good: never sent, not listed, and holding its event from retention
// (review). A webhook gets only the events that happened once it existed:
// fanned out later (a sweep interval, a minute on cron), an event of just
// before its creation reached it too (webhooks QA). Likewise a disabled
// webhook (Update) gets none of the events recorded while it was
// disabled, from its disabled_at on, nor of its last period disabled once
// enabled again (last_disabled): they are skipped, as Stripe skips a
// disabled endpoint's; one recorded before it was disabled is fanned out
// into a delivery that is held (claim) until it is enabled again.
var sqlDispatch = `
WITH ev AS (
    SELECT id, workspace_id, type, created_at FROM events
    WHERE id = ANY($2::text[])
), fan AS (
    INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_id, event_type, state, next_attempt_at, created_at)
    SELECT 'dlv_' || substr(md5(w.id || ev.id), 1, 26), w.id, ev.workspace_id, ev.id, ev.type, 'pending', $1, $1
    FROM ev JOIN webhooks w ON w.workspace_id = ev.workspace_id AND w.deleted_at IS NULL AND ev.type = ANY (w.events)
        AND w.created_at <= ev.created_at
        AND (w.disabled_at IS NULL OR ev.created_at < w.disabled_at)
        AND NOT coalesce(w.last_disabled @> ev.created_at, false)
    FOR SHARE OF w
    ON CONFLICT (webhook_id, event_id) DO NOTHING
)
UPDATE events SET dispatched_at = $1 WHERE id = ANY($2::text[])`

// Dispatch fans undispatched outbox events out into one pending delivery per
// matching subscription, up to DispatchBatch of them (sweep.Task.Drains: a
// pass with a deadline runs it again while it fans a whole batch out).
// Events nobody subscribes to are marked dispatched too.
//
// A subscription gets every matching event whose created_at is at or
// after its own, and none before. A fan-out therefore waits for the
// creates in progress in its batch's workspaces (sqlDispatchWait) and
// then reads the webhooks afresh (sqlDispatch): in one statement, a
// webhook whose create had not committed when the statement began was not
// seen, and the event, marked dispatched, never reached it, though
// recorded after the webhook's created_at, even after its create answered
// (webhooks QA). A create that waits for a fan-out reads its clock once
// that fan-out has committed (Create), so the batch's events lie before
// it. The wait is one lock a workspace of the batch (at most
// DispatchBatch), none when there is nothing to fan out.
func (s *Service) Dispatch(ctx context.Context, now time.Time) (int, error) {
	var n int
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		n, err = s.dispatchIn(ctx, tx, now)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("dispatch events: %w", err)
	}
	return n, nil
}

// dispatchIn is Dispatch's work in tx.
func (s *Service) dispatchIn(ctx context.Context, tx pgx.Tx, now time.Time) (int, error) {
	rows, err := tx.Query(ctx, sqlDispatchPick, s.dispatchBatch)
	if err != nil {
		return 0, err
	}
	var evs, workspaces []string
	var id, ws string
	if _, err := pgx.ForEachRow(rows, []any{&id, &ws}, func() error {
		evs = append(evs, id)
		workspaces = append(workspaces, ws)
		return nil
	}); err != nil {
		return 0, err
	}
	if len(evs) == 0 {
		return 0, nil
	}
	slices.Sort(workspaces)
	if _, err := tx.Exec(ctx, sqlDispatchWait, slices.Compact(workspaces)); err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, sqlDispatch, now, evs)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// DispatchBatch is the most events one Dispatch fans out (its
// sweep.Task.Batch).
func (s *Service) DispatchBatch() int { return s.dispatchBatch }

// sqlPurgeDelivered is PurgeDelivered's statement ($1 cutoff, $2 limit,
// after ($3 created_at, $4 id)). It answers the events it deleted and the
// last event its batch looked at (none when it found none): the next batch
// of the pass starts after it (sweep.Place), through events_purge_idx
// (migration 0087), so the events kept in front (the latest
// reconciliation.due of each type, one whose delivery is still pending)
// are read once a pass, not once a batch (review: 50,000 kept, each batch
// of 1,000 read 102,000 events).
// The batch's deliveries are locked through webhook_deliveries_event_idx
// and deleted by the ids locked, each as = ANY(ARRAY(…)) (as db.RoundRobin
// says): joined to the batch, the planner hashed the whole table for each
// of the two, whatever the batch (scale QA: 33,000 deliveries read twice
// for each 1,000 events). The batch's events are deleted by their ids so
// too: joined to the batch alone, they were hashed from a scan of every
// event kept, planned once for any batch or on a small table (scale QA:
// 400,000 read for each 1,000 events).
const sqlPurgeDelivered = `
	WITH old AS (
	    SELECT e.id, e.created_at FROM events e
	    WHERE e.created_at < $1::timestamptz AND e.dispatched_at IS NOT NULL
	      AND (e.created_at, e.id) > ($3::timestamptz, $4::text)
	      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.state = 'pending')
	      AND NOT (e.type = '` + events.ReconciliationDue + `' AND NOT EXISTS (
	          SELECT 1 FROM events n WHERE n.workspace_id = e.workspace_id AND n.type = e.type
	            AND n.subject_id = e.subject_id AND n.created_at > e.created_at))
	    ORDER BY e.created_at, e.id
	    LIMIT $2::int
	    FOR UPDATE OF e SKIP LOCKED
	), locked AS (
	    -- In id order, as a retry locks them (one order: no deadlock).
	    SELECT d.id FROM webhook_deliveries d WHERE d.event_id = ANY(ARRAY(SELECT id FROM old))
	    ORDER BY d.id
	    FOR UPDATE OF d
	), d AS (
	    DELETE FROM webhook_deliveries d WHERE d.id = ANY(ARRAY(SELECT id FROM locked)) AND d.state <> 'pending'
	    RETURNING d.event_id
	), gone AS (
	    -- Counted once, not scanned again for each event: a count per
	    -- event read the whole of d each time, limit times (scale QA:
	    -- 1,000 events of 2 deliveries took 230 ms of a 450 ms pass,
	    -- and the work grows with the square of the batch).
	    SELECT d.event_id, count(*) AS n FROM d GROUP BY d.event_id
	), purged AS (
	    DELETE FROM events e USING old LEFT JOIN gone ON gone.event_id = old.id
	    WHERE e.id = ANY(ARRAY(SELECT id FROM old)) AND e.id = old.id
	      AND coalesce(gone.n, 0) = (SELECT count(*) FROM webhook_deliveries x WHERE x.event_id = e.id)
	    RETURNING 1
	), last AS (
	    SELECT old.created_at, old.id FROM old ORDER BY old.created_at DESC, old.id DESC LIMIT 1
	)
	SELECT (SELECT count(*) FROM purged), (SELECT created_at FROM last), (SELECT id FROM last)`

// purgePlace is where PurgeDelivered's batches have got to in a pass
// (sweep.Place): the last event a batch looked at.
type purgePlace struct {
	createdAt time.Time
	id        string
}

// PurgeDelivered deletes up to limit outbox events recorded before cutoff,
// with their deliveries, once they are dispatched and none of their
// deliveries is still pending (retries end within about 15 hours; a
// disabled webhook's held ones end once they have waited as long,
// ExpireHeld). A
// delivery that a retry (Retry) made pending after this statement's
// snapshot is kept, and its event with it: the delete of deliveries
// rechecks each row it meets at its newest version, and the event goes
// only with every delivery it had (review: a retry answered pending, and
// the delivery was deleted). The
// latest reconciliation.due of each effect type stays: its row told the
// sweeper the current period was reminded (a period can last up to a
// year), so deleting it sent the same reminder again; the sweeper reads
// reconciliation_reminders now, which migration 0086 filled from these
// rows, and a release before it, serving during a deploy or after a
// rollback, still reads them. It answers how many events it deleted.
// Within a pass (sweep.PlaceOf), each batch starts after the last event
// the one before it looked at: one kept or passed over is read again by
// the next pass.
func (s *Service) PurgeDelivered(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	place := sweep.PlaceOf(ctx)
	after, _ := place.At.(purgePlace)
	var (
		n      int
		lastAt *time.Time
		lastID *string
	)
	err := s.pool.QueryRow(ctx, sqlPurgeDelivered, cutoff, limit, after.createdAt, after.id).Scan(&n, &lastAt, &lastID)
	if err != nil {
		return 0, fmt.Errorf("purge events: %w", err)
	}
	if lastAt != nil && lastID != nil {
		place.At = purgePlace{createdAt: *lastAt, id: *lastID}
	}
	return n, nil
}

// sqlExpireHeld ends up to $2 pending deliveries due before $1 (the
// events' retention cut-off) whose webhook is disabled or deleted: failed,
// with last_error expiredWhileDisabled, or abandoned for a deleted one.
// Only a delivery that waits on its webhook is due that long: the claim
// takes every other one within a pass of its due time and pushes it into
// the future, so a delivery being sent is never among them. The rest that
// are (those held for a signing secret this instance cannot open, sqlHeld)
// are walked over, not ended. Through webhook_deliveries_due_idx, oldest
// due first: the rows read are those due before the cut-off, not every
// pending one (testpg.CheckBacklog). Each webhook is held FOR SHARE: an
// enable (Update) committed after this statement's snapshot is seen when
// its row is locked, and one still in progress, like a delete, holds the
// row and its deliveries are left to a later pass (SKIP LOCKED, as for
// the deliveries: it never waits, so it cannot deadlock with the locks a
// delete, a retry or the purge take in id order). The rows it ends are
// updated by id (= ANY(ARRAY(…)), as db.RoundRobin says): joined to the
// batch, the planner hashed it and scanned the whole table.
var sqlExpireHeld = `
WITH held AS (
    SELECT d.id, w.deleted_at IS NOT NULL AS deleted
    FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
    WHERE d.state = 'pending' AND d.next_attempt_at < $1::timestamptz
      AND (w.deleted_at IS NOT NULL OR w.disabled_at IS NOT NULL)
    ORDER BY d.next_attempt_at
    LIMIT $2::int
    FOR UPDATE OF d SKIP LOCKED
    FOR SHARE OF w SKIP LOCKED
)
UPDATE webhook_deliveries d SET state = 'failed',
    last_error = CASE WHEN d.id = ANY(ARRAY(SELECT id FROM held WHERE deleted))
        THEN '` + abandoned + `' ELSE '` + expiredWhileDisabled + `' END
WHERE d.id = ANY(ARRAY(SELECT id FROM held))`

// ExpireHeld ends, up to limit, the deliveries held longer than the
// events' retention (due before cutoff, EVENT_RETENTION_DAYS ago; their
// events are older still) while their webhook is disabled: they end failed
// (expiredWhileDisabled), and PurgeDelivered, which keeps an event while a
// delivery of it is pending, then takes them with their events. Held until
// the webhook was enabled or deleted, they kept their events, payloads
// included, past the retention the README states, for as long as it stayed
// disabled (webhooks QA). Enabled later, the webhook is not sent them:
// their events are past the retention; a retry makes one pending again,
// due then (and held again while the webhook is disabled). It also ends
// the pending deliveries of a deleted webhook, as its delete does
// (abandoned): only an instance of an earlier release fanning out while
// the delete commits leaves one, which was never sent and held its event
// for good. It answers how many it ended. The sweeper's
// webhooks.expire_held task runs it just before events.retention's
// PurgeDelivered, with the same cut-off.
func (s *Service) ExpireHeld(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, sqlExpireHeld, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("expire held deliveries: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// sqlHeld lists the live webhooks with deliveries due ($1) whose signing
// secret this instance cannot open: its first five bytes are those of none
// of its keys ($2, seal.Sealer.Headers), as when the key that sealed it was
// removed from RESULT_ENCRYPTION_KEYS before a reseal, or the instance still
// runs the settings before a rotation. The claim passes over them: their
// deliveries stay pending, attempts untouched, for an instance that has the
// key or until it is configured again (QA: each was claimed, spent an
// attempt it could not send, and ended failed after MaxAttempts, its events
// lost to a configuration mistake). The lateral runs only for such
// webhooks, none at all normally.
const sqlHeld = `
SELECT w.id, substring(w.secret FROM 1 FOR 5) FROM webhooks w
WHERE w.deleted_at IS NULL AND w.disabled_at IS NULL AND NOT substring(w.secret FROM 1 FOR 5) = ANY ($2::bytea[])
  AND EXISTS (SELECT 1 FROM webhook_deliveries d
      WHERE d.webhook_id = w.id AND d.state = 'pending' AND d.next_attempt_at <= $1::timestamptz)
ORDER BY w.id`

// reportHeld logs, once a pass, each webhook whose due deliveries the claim
// passes over because this instance cannot open its signing secret, by
// webhook id and key id (never the secret): the operator must hear of it,
// and the deliveries' records alone reach only their owner.
func (s *Service) reportHeld(ctx context.Context, now time.Time) error {
	err := s.conns.Hold(ctx, func() error {
		rows, err := s.pool.Query(ctx, s.heldSQL, now, s.sealer.Headers())
		if err != nil {
			return err
		}
		var id string
		var header []byte
		_, err = pgx.ForEachRow(rows, []any{&id, &header}, func() error {
			keyID := seal.KeyIDOf(header)
			if keyID == "" {
				keyID = "none (not a ciphertext)"
			}
			s.logger.Error("webhook deliveries held: the signing secret is sealed with a key this instance is not "+
				"configured with (RESULT_ENCRYPTION_KEY, RESULT_ENCRYPTION_KEYS); they are sent, their attempts untouched, "+
				"once an instance has the key", "webhook_id", id, "key_id", keyID)
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("held deliveries: %w", err)
	}
	return nil
}

// Payload is a delivery's body: the event it sends. Its fields are in
// the order of their names, as the map it replaced wrote them, so that a
// delivery's bytes are what they were.
type Payload struct {
	CreatedAt   time.Time       `json:"created_at" jsonschema:"when the event happened (RFC 3339, UTC)"`
	Data        json.RawMessage `json:"data" jsonschema:"the event's details, a JSON object of ids, states, counts and times (never payloads, inputs, outputs or results; times in UTC with Z); its fields depend on the type"`
	ID          string          `json:"id" jsonschema:"the event's id (evt_…), also sent as Ratchet-Event-Id: the same in every attempt and every retry, so deduplicate by it"`
	SubjectID   string          `json:"subject_id" jsonschema:"what the event is about: the effect, run, step, approval, effect type or endpoint (* for the emergency stop's circuit events)"`
	Type        string          `json:"type" openapi:"enum=effect.indeterminate|circuit.tripped|circuit.closed|approval.requested|approval.decided|reconciliation.due|run.finished|step.exhausted|step.replayed"`
	WorkspaceID string          `json:"workspace_id" jsonschema:"the workspace of the event and of the subscription"`
}

// SendTimeout is how long a delivery waits for its receiver's answer.
const SendTimeout = sendTimeout

type claimed struct {
	id, url      string
	secret       []byte
	previous     []byte // the rotated secret, while it still signs
	webhookID    string
	attempts     int
	claims       int // the row's claims as this claim counted them (sqlClaim): the record's fence (sqlRecord)
	eventID      string
	eventType    string
	eventData    []byte
	eventCreated time.Time
	subjectID    string
	workspaceID  string
}

// Deliver sends due deliveries in rounds, each taking every webhook's and
// workspace's bounded share, for as long as the last round sent something
// and the pass has time for another: one round a pass sent at most
// perWebhook events a webhook, so a burst waited pass after pass (QA: 200
// events to one webhook took 55 s, "within one pass" promised). A round
// does not wait for its slowest receiver: once its sends are done, or after
// roundWait, the next round claims again, leaving out the webhooks whose
// sends are still in flight and the workspaces holding their share of them
// (QA: one receiver taking 9 s held every other receiver, another
// workspace's included, to one round of 20 a pass). A webhook has at most
// perWebhook sends in flight, the pass at most maxInFlight; the pass ends
// when every send it started has been recorded. The report of held
// deliveries (reportHeld) only logs: the pass goes on past its failure,
// since stopping there held every webhook's deliveries for a log line, and
// answers it with the pass's own, so that the sweep reports it as it
// reports any task's (a database outage summarised, not an error line
// per pass: the crash test caught one every 100 ms).
func (s *Service) Deliver(ctx context.Context, now time.Time) (int, error) {
	heldErr := s.reportHeld(ctx, now)
	if heldErr != nil {
		heldErr = fmt.Errorf("report held deliveries: %w", heldErr)
	}
	p := s.newPass()
	total := 0
	for rounds := 0; rounds < maxRounds; {
		// The first round too: one started with less than a send's time
		// left cut its sends short and used up their attempts (review).
		if !timeForARound(ctx, s.sendTimeout) {
			break
		}
		if rounds > 0 || p.inFlight() > 0 {
			now = s.now()
		}
		p.drainEnded() // a send that ends from here on leaves a token for awaitOne
		hooks := p.busy()
		room := maxInFlight - p.inFlight()
		var batch []claimed
		if room > 0 {
			var err error
			if batch, err = s.claim(ctx, now, min(deliverBatch, room), hooks); err != nil {
				p.fail(err)
				break
			}
		}
		if len(batch) == 0 {
			// Nothing left out and nothing due: done. Otherwise what is due
			// may belong to webhooks in flight: look again once a send ends.
			if len(hooks) == 0 || !p.awaitOne(ctx) {
				break
			}
			continue
		}
		rounds++
		total += len(batch)
		p.await(ctx, p.send(ctx, batch), roundWait)
	}
	p.wg.Wait()
	return total, errors.Join(heldErr, p.err())
}

// RoundTime is what a sweep keeps for delivery (sweep.Task.Needs): a
// round's longest time (a send's timeout and the recording of its outcome)
// and a second to claim and start it, so that the round is still started
// when the task before took all it was allowed (review).
const RoundTime = sendTimeout + recordTimeout + time.Second

// timeForARound says whether ctx leaves a round its longest time: a send's
// timeout (send) and the recording of its outcome.
func timeForARound(ctx context.Context, send time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	deadline, ok := ctx.Deadline()
	return !ok || time.Until(deadline) > send+recordTimeout
}

// pass tracks the sends one Deliver has in flight: by webhook, which the
// next round's claim leaves out while they are in flight (the workspaces'
// shares, and the webhooks', are counted across passes by the claim), and
// the first error of any; and the outcomes of those that ended,
// until they are recorded (record).
type pass struct {
	s        *Service
	wg       sync.WaitGroup
	ended    chan struct{} // one token per send that ended
	mu       sync.Mutex
	hooks    map[string]int
	n        int
	firstErr error
	// sending counts the sends started whose outcome is not queued yet;
	// queue holds the outcomes waiting to be recorded, and ready is closed
	// when they are to be recorded at once (record).
	sending int
	queue   []queued
	ready   chan struct{}
}

// queued is an outcome waiting in a pass's queue, and where its record's
// error goes.
type queued struct {
	o    outcome
	done chan error
}

func (s *Service) newPass() *pass {
	return &pass{s: s, ended: make(chan struct{}, maxInFlight), hooks: map[string]int{}}
}

func (p *pass) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// busy lists the webhooks with a send of the pass in flight.
func (p *pass) busy() (hooks []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hooks = []string{}
	for id := range p.hooks {
		hooks = append(hooks, id)
	}
	return hooks
}

func (p *pass) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.firstErr == nil {
		p.firstErr = err
	}
}

func (p *pass) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firstErr
}

// send starts every delivery of batch at once and answers a channel closed
// when all of them have been recorded. (Sent a few at a time, slow
// receivers once outlasted the sweeper's time for the task, whose end cut
// sends short and lost their outcomes: counted attempts never sent,
// successes sent again.) Outcomes are recorded whatever is left of the
// pass's time: a delivery that was sent is recorded.
func (p *pass) send(ctx context.Context, batch []claimed) <-chan struct{} {
	p.mu.Lock()
	for _, c := range batch {
		p.hooks[c.webhookID]++
		p.n++
		p.sending++
	}
	p.mu.Unlock()
	var round sync.WaitGroup
	for _, c := range batch {
		p.wg.Add(1)
		round.Add(1)
		go func(c claimed) {
			defer p.wg.Done()
			defer round.Done()
			o, err := p.s.deliverOne(ctx, c)
			if err == nil && o != nil {
				err = p.record(ctx, *o)
			} else {
				p.unqueued()
			}
			if err != nil {
				p.fail(err)
			}
			p.mu.Lock()
			if p.hooks[c.webhookID]--; p.hooks[c.webhookID] == 0 {
				delete(p.hooks, c.webhookID)
			}
			p.n--
			p.mu.Unlock()
			select {
			case p.ended <- struct{}{}:
			default: // the buffer holds maxInFlight: a waiter has a token already
			}
		}(c)
	}
	done := make(chan struct{})
	go func() {
		round.Wait()
		close(done)
	}()
	return done
}

// record records o with the outcomes of the pass's other sends that end
// within recordWait of it, in one statement (Service.recordOutcomes), and
// answers once it is recorded. The first outcome of a queue waits for the
// others: at most recordWait, and not at all once every send the pass has
// started has ended (none is left to wait for) or the queue holds a
// round's worth. The wait and the record run whatever is left of the
// pass's time (recordOutcomes), so an ended send's outcome is never lost
// to a pass that stops; and a pass ends only once each of its sends' is
// recorded (Deliver waits for the sends, each for its record).
func (p *pass) record(ctx context.Context, o outcome) error {
	done := make(chan error, 1)
	p.mu.Lock()
	first := len(p.queue) == 0
	if first {
		p.ready = make(chan struct{})
	}
	p.queue = append(p.queue, queued{o: o, done: done})
	p.sending--
	ready := p.ready
	p.readyIfAllEnded()
	p.mu.Unlock()
	if first {
		t := time.NewTimer(p.s.recordWait)
		select {
		case <-ready:
		case <-t.C:
		}
		t.Stop()
		p.mu.Lock()
		batch := p.queue
		p.queue = nil
		p.mu.Unlock()
		outs := make([]outcome, len(batch))
		for i, q := range batch {
			outs[i] = q.o
		}
		err := p.s.recordOutcomes(ctx, outs)
		for _, q := range batch {
			q.done <- err
		}
	}
	return <-done
}

// unqueued counts a send that ended with no outcome to record (abandoned,
// or failed before it was sent).
func (p *pass) unqueued() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sending--
	p.readyIfAllEnded()
}

// readyIfAllEnded tells the queue's first outcome to stop waiting once
// no send of the pass is left that could join it, or it holds a round's
// worth. Under p.mu.
func (p *pass) readyIfAllEnded() {
	if len(p.queue) == 0 || (p.sending > 0 && len(p.queue) < deliverBatch) {
		return
	}
	select {
	case <-p.ready:
	default:
		close(p.ready)
	}
}

// await waits for a round's sends to end, at most d.
func (p *pass) await(ctx context.Context, done <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// drainEnded forgets the sends that ended so far.
func (p *pass) drainEnded() {
	for {
		select {
		case <-p.ended:
		default:
			return
		}
	}
}

// awaitOne waits for a send to end (one that ended since the last
// drainEnded counts): false when ctx ended first.
func (p *pass) awaitOne(ctx context.Context) bool {
	select {
	case <-p.ended:
		return true
	case <-ctx.Done():
		return false
	}
}

// claim claims up to limit due deliveries, none of the webhooks named
// (their sends of this pass are still in flight), taking turns among the
// workspaces: each workspace's sends in flight, every pass's and
// instance's (their holds, sqlClaim), count as its first turns, so one
// with perWorkspace in flight gets none, and one with fewer gets its next
// ones only after every workspace with fewer still in flight got its turn;
// a webhook with perWebhook in flight gets none either. Counted by each
// pass alone, the bounds held per pass: a slow receiver with a backlog had
// up to 8 × 20 sends in flight from the local server's passes, more with
// several instances (review). In the order deliveries fell due alone (how the
// claim took them before), three workspaces whose receivers hung (timed
// out after 10 s) filled the pass's room for sends, their backlog older
// than any other's, and took it again each time their sends ended: every
// other workspace's deliveries waited behind them (multi-tenant QA; and a
// workspace with one send short of its share in flight could claim a
// share more). Each is pushed claimHold into the future in one statement
// before anything is sent, so concurrent sweepers send disjoint sets; the
// outcomes are then recorded as the sends end (pass.record). It passes
// over the webhooks whose signing secret this instance cannot open
// (sqlHeld), and the disabled ones (Update), reading each webhook as it is
// when the statement starts: a claim that starts after an update committed
// sends to its url.
func (s *Service) claim(ctx context.Context, now time.Time, limit int, hooks []string) ([]claimed, error) {
	var batch []claimed
	err := s.conns.Hold(ctx, func() error {
		// Every parameter is cast: with DB_QUERY_EXEC_MODE=simple_protocol
		// they arrive as untyped literals, and "$1 + interval" read $1 as an
		// interval.
		rows, err := s.pool.Query(ctx, sqlClaim,
			now, limit, claimHold.Seconds(), perWebhook, perWorkspace, hooks, s.sealer.Headers())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c claimed
			var data string
			if err := rows.Scan(&c.id, &c.url, &c.secret, &c.previous, &c.webhookID, &c.attempts, &c.claims, &c.eventID,
				&c.eventType, &data, &c.eventCreated, &c.workspaceID, &c.subjectID); err != nil {
				return fmt.Errorf("scan delivery: %w", err)
			}
			c.eventData = []byte(data)
			batch = append(batch, c)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return batch, nil
}

// sqlHeldSends counts the sends in flight of every pass and instance
// ($1 the claim's time): each webhook's live holds (held_until, migration
// 0082; one past its time is a stopped sweeper's, and counts as none).
// Every held row is read, through webhook_deliveries_held_idx (its
// predicate: a handful of rows), and the live ones counted: with
// "held_until > $1" as the condition, a generic plan estimated a third of
// the pending rows and read them all through webhook_deliveries_due_idx.
const sqlHeldSends = `
		    SELECT workspace_id, webhook_id, count(*) FILTER (WHERE held_until > $1::timestamptz)::int AS n
		    FROM webhook_deliveries
		    WHERE state = 'pending' AND held_until IS NOT NULL
		    GROUP BY workspace_id, webhook_id
		`

// sqlClaim is claim's statement. Each claim counts an attempt and a claim
// (claims, migration 0073): attempts goes back to 0 on a retry, claims only
// grows, and fences the failure's record (sqlRecord). Each claimed delivery is
// held (held_until, migration 0082) until its record, and the claim counts
// every pass's and instance's live holds against perWebhook and
// perWorkspace. Two claims at once each count only the holds committed
// before them, but take their shares from the same oldest-first turns, so
// the rows one locked the other skips (SKIP LOCKED) or finds no longer due:
// together they claim no more than one would have.
var sqlClaim = `
		WITH held AS (` + sqlHeldSends + `), cand AS (
		    -- Each live webhook's due deliveries, oldest first, up to its
		    -- share left (perWebhook less its sends in flight), and each
		    -- workspace's (perWorkspace, its sends in flight counted first),
		    -- in turns: every workspace's next delivery, then every one's
		    -- next. Chosen without locks: locking inside the lateral would
		    -- hold perWebhook rows of every webhook to keep deliverBatch.
		    SELECT id, next_attempt_at, turn FROM (
		        SELECT d.id, d.next_attempt_at,
		               coalesce((SELECT sum(h.n)::int FROM held h WHERE h.workspace_id = hook.workspace_id), 0)
		               + row_number() OVER (PARTITION BY hook.workspace_id ORDER BY d.next_attempt_at, d.id) AS turn
		        -- Only the webhooks with a delivery pending, one descent each of
		        -- webhook_deliveries_webhook_due_idx, then a probe each by id
		        -- (LIMIT 1: as a join, the planner hashed every webhook): every
		        -- live webhook was read and probed on every pass, whether or not
		        -- it had any (sweeper scale QA: 10,000 webhooks, 10,000 buffers
		        -- a pass with nothing to send).
		        FROM ` + db.DistinctWith("webhook_deliveries", "webhook_id", "state = 'pending'") + ` p
		        CROSS JOIN LATERAL (
		            SELECT w.id, w.workspace_id FROM webhooks w
		            -- A disabled webhook's deliveries are held (Update).
		            WHERE w.id = p.webhook_id AND w.deleted_at IS NULL AND w.disabled_at IS NULL
		              AND NOT w.id = ANY ($6::text[])
		              -- A secret this instance cannot open: held (sqlHeld).
		              AND substring(w.secret FROM 1 FOR 5) = ANY ($7::bytea[])
		            LIMIT 1
		        ) hook
		        CROSS JOIN LATERAL (
		            SELECT id, next_attempt_at FROM webhook_deliveries
		            WHERE webhook_id = hook.id AND state = 'pending' AND next_attempt_at <= $1::timestamptz
		            ORDER BY next_attempt_at
		            LIMIT greatest($4::int - coalesce((SELECT h.n FROM held h WHERE h.webhook_id = hook.id), 0), 0)
		        ) d
		    ) x
		    WHERE turn <= $5::int
		    ORDER BY turn, next_attempt_at, id LIMIT $2::int * 3
		), due AS (
		    -- Three batches' worth of candidates, so that a pass running at
		    -- the same moment takes the next ones rather than none.
		    SELECT d.id FROM webhook_deliveries d JOIN cand c ON c.id = d.id
		    WHERE d.state = 'pending' AND d.next_attempt_at <= $1::timestamptz
		    ORDER BY c.turn, c.next_attempt_at, c.id LIMIT $2::int
		    FOR UPDATE OF d SKIP LOCKED
		)
		UPDATE webhook_deliveries d
		SET next_attempt_at = $1::timestamptz + make_interval(secs => $3::float8), attempts = d.attempts + 1,
		    claims = d.claims + 1, held_until = $1::timestamptz + make_interval(secs => $3::float8)
		FROM due, webhooks w, events e
		WHERE d.id = due.id AND w.id = d.webhook_id AND e.id = d.event_id
		RETURNING d.id, w.url, w.secret, CASE WHEN w.previous_secret_expires_at > $1::timestamptz THEN w.previous_secret END,
		    w.id, d.attempts, d.claims, e.id, e.type, e.data::text, e.created_at, e.workspace_id, e.subject_id`

// outcome is how a send ended, to record (recordOutcomes): at, its end;
// code, the receiver's status, nil when none answered; failure, why it
// failed, "" for a 2xx.
type outcome struct {
	c       claimed
	at      time.Time
	code    *int
	failure string
}

// deliverOne sends one delivery and answers its outcome, to record; none
// when it ended without a send to record (abandoned, recorded here, or an
// error). Only the status code and a short fixed reason are stored, never
// the receiver's response body.
func (s *Service) deliverOne(ctx context.Context, c claimed) (*outcome, error) {
	ended := func(code *int, failure string) (*outcome, error) {
		return &outcome{c: c, at: s.now(), code: code, failure: failure}, nil
	}
	if len(c.secret) == 0 {
		// Only a deleted webhook has no secret (sqlDelete erases it, a
		// CHECK keeps a live one's), and a claim passes over deleted
		// webhooks. Never sign with nothing: a NULL ciphertext opens to
		// an empty secret, whose HMAC anyone can compute. The delivery
		// ends as its webhook's delete ends the pending ones.
		s.logger.Error("webhook has no signing secret (deleted); delivery not sent",
			"webhook_id", c.webhookID, "delivery_id", c.id)
		return nil, s.abandon(ctx, c)
	}
	secret, err := s.sealer.Open(c.secret, seal.AAD(c.webhookID, "secret"))
	if err != nil {
		// Under one of this instance's keys (the claim passes over the
		// others), yet it fails to open: garbled, which no key mends, so
		// the attempt counts. The operator must hear of it, the delivery's
		// record alone reaches only its owner.
		s.logger.Error("webhook signing secret cannot be opened; delivery not sent",
			"webhook_id", c.webhookID, "delivery_id", c.id, "err", err)
		return ended(nil, "cannot open signing secret")
	}
	secrets := []string{string(secret)}
	if c.previous != nil {
		// The rotated secret signs too, until it expires; one that cannot
		// be opened is left out (the new one still signs), and said so: a
		// receiver still holding it refuses the delivery.
		if previous, err := s.sealer.Open(c.previous, seal.AAD(c.webhookID, "secret")); err == nil {
			secrets = append(secrets, string(previous))
		} else {
			s.logger.Warn("webhook previous signing secret cannot be opened; signed with the current one alone",
				"webhook_id", c.webhookID, "delivery_id", c.id, "err", err)
		}
	}
	body, err := json.Marshal(Payload{ID: c.eventID, Type: c.eventType, CreatedAt: c.eventCreated.UTC(),
		WorkspaceID: c.workspaceID, SubjectID: c.subjectID, Data: json.RawMessage(utcZ(c.eventData))})
	if err != nil {
		return nil, fmt.Errorf("encode delivery: %w", err)
	}
	// A send runs its course (s.sendTimeout) even when the pass is stopped
	// (the local server shutting down, a cron caller gone): the receiver may
	// have the delivery already, and cut short it was recorded failed and
	// sent again (QA: each restart of scripts/dev sent the deliveries in
	// flight twice). A pass's deadline never cuts one: a round starts only
	// with a send's time left (timeForARound), and stops none after it.
	sendCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.sendTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(sendCtx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return ended(nil, "invalid url")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Ratchet-Webhooks/1")
	req.Header.Set("Ratchet-Event-Id", c.eventID)
	req.Header.Set("Ratchet-Signature", Sign(s.now(), body, secrets...))
	res, err := s.client.Do(req)
	if err != nil {
		return ended(nil, sendFailure(err, s.sendTimeout))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	code := res.StatusCode
	if code >= 200 && code < 300 {
		return ended(&code, "")
	}
	return ended(&code, "non-2xx response")
}

// abandon ends a claimed delivery that must not be sent, as its webhook's
// delete ends the pending ones (abandoned).
func (s *Service) abandon(ctx context.Context, c claimed) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if err := s.exec(ctx, `UPDATE webhook_deliveries SET state = 'failed', last_error = $2
		WHERE id = $1 AND state = 'pending'`, c.id, abandoned); err != nil {
		return fmt.Errorf("record delivery: %w", err)
	}
	return nil
}

// recordOutcomes records the outcomes of ended sends in one statement
// (sqlRecord), with recordTimeout to do it whatever is left of the pass's
// time: a send that ended is recorded even when its pass was stopped. The
// failures' next attempts are decided here, each by its own claim's
// attempts (Backoff).
func (s *Service) recordOutcomes(ctx context.Context, outs []outcome) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	n := len(outs)
	ids, claims, attempts := make([]string, n), make([]int32, n), make([]int32, n)
	codes, failures := make([]*int32, n), make([]*string, n)
	at, due := make([]time.Time, n), make([]time.Time, n)
	for i, o := range outs {
		ids[i], claims[i], attempts[i], at[i], due[i] = o.c.id, int32(o.c.claims), int32(o.c.attempts), o.at, o.at
		if o.code != nil {
			code := int32(*o.code)
			codes[i] = &code
		}
		if o.failure != "" {
			failures[i] = &o.failure
			if o.c.attempts < MaxAttempts {
				due[i] = o.at.Add(Backoff(o.c.attempts))
			}
		}
	}
	// The statement locks its rows in id order, as a retry, a delete and
	// retention lock theirs; a deadlock no order avoids is tried again
	// (db.RetryDeadlocks: the statement reads each row anew).
	err := db.RetryDeadlocks(ctx, func() error {
		return s.exec(ctx, sqlRecord, ids, claims, attempts, codes, failures, at, due, MaxAttempts)
	})
	if err != nil {
		return fmt.Errorf("record deliveries: %w", err)
	}
	return nil
}

// sqlRecord records ended sends' outcomes, one row each of the arrays
// $1 to $7 (delivery id, its claim's claims and attempts, the status code
// or NULL, the failure or NULL for a 2xx, the send's end, and the failure's
// next attempt), by the same rules each outcome had in a statement of its
// own:
//
//   - A 2xx is recorded delivered whichever attempt answered it (the event
//     arrived), also when its webhook's delete abandoned it or an update of
//     its events ended it while it was sent (QA: it read failed), and when
//     a later claim's send (superseded, below) failed on the last attempt
//     and ended it failed before this one answered (review: it read failed,
//     the event arrived).
//   - A failure is retried at its next attempt, or ends failed on the last
//     one, unless a retry gave its attempts back while it was sent (Retry):
//     then it is due again at once (its end), whichever attempt it was, as
//     the retry promised (the row counts fewer attempts than the claim: only
//     a retry lowers them). Decided by the row's attempts, not the claim's:
//     a retry of a delivery ended mid-send (a PATCH of its events) made it
//     due when the send's hold lapsed, and the failure then put it off by
//     the old attempt's backoff (webhooks review).
//   - A failure whose claim a later one superseded (this send outlived its
//     claim's minute, as one of an instance frozen mid-send and thawed
//     later does) records nothing: its backoff would cut the later send's
//     claim short, and on the last attempt end the delivery failed before
//     that send's answer, even a 2xx, could be recorded (webhooks model
//     QA). Superseded means the row counts another claim (claims,
//     migration 0073, which only grows), or more attempts: attempts alone
//     let a retry, which gives them back while the last one is in flight,
//     make a later claim count as few as this one, whose failure then cut
//     that claim short (webhooks QA). The attempts fence stays for a claim
//     by an instance of the release before 0073, which counts no claim: at
//     worst it is fenced as it was then.
//   - The claim's hold (held_until, migration 0082) ends with its record:
//     its send is no longer in flight. Only a superseded send's 2xx records
//     over another claim's: it ends the delivery (no claim counts the holds
//     of one no longer pending) and keeps that later claim's hold, whose
//     send is still in flight, so that a retry of the delivery waits for it
//     (sqlRetryDeliveries). Cleared, a retry made the delivery due at once
//     and a pass sent it a third time beside the later send (webhooks
//     review).
//
// The rows are locked in id order first, as a retry, a delete and
// retention lock them (one order: no deadlock), and each is then updated
// as locked, its newest version (EvalPlanQual), never as the statement's
// snapshot read it.
const sqlRecord = `
WITH o AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::text[], $6::timestamptz[], $7::timestamptz[])
        AS o(id, claims, attempts, code, failure, at, due)
), locked AS (
    SELECT d.id FROM webhook_deliveries d WHERE d.id = ANY ($1::text[])
    ORDER BY d.id
    FOR UPDATE
)
UPDATE webhook_deliveries d
SET state = CASE WHEN o.failure IS NULL THEN 'delivered' WHEN d.attempts >= $8::int THEN 'failed' ELSE 'pending' END,
    delivered_at = CASE WHEN o.failure IS NULL THEN o.at ELSE d.delivered_at END,
    next_attempt_at = CASE WHEN o.failure IS NULL OR d.attempts >= $8::int THEN d.next_attempt_at
        WHEN d.attempts < o.attempts THEN o.at ELSE o.due END,
    last_status_code = o.code, last_error = o.failure,
    held_until = CASE WHEN d.claims > o.claims THEN d.held_until END
FROM o, locked
WHERE d.id = o.id AND locked.id = o.id AND CASE WHEN o.failure IS NULL
    THEN d.state = 'pending' OR (d.state = 'failed' AND (d.last_error IN ('` + abandoned + `', '` + unsubscribed + `')
        OR d.claims > o.claims OR d.attempts > o.attempts))
    ELSE d.state = 'pending' AND d.attempts <= o.attempts AND d.claims = o.claims END`

// exec runs one statement of deliveries' outcomes on the passes' share of
// the pool (Service.conns): as a round's sends end, their records (a few
// statements, recordOutcomes) run beside other passes' claims and records,
// and on the pool alone up to 100 records at once took every one of its
// connections, the instance's requests queued behind them (soak QA).
func (s *Service) exec(ctx context.Context, sql string, args ...any) error {
	return s.conns.Hold(ctx, func() error {
		_, err := s.pool.Exec(ctx, sql, args...)
		return err
	})
}

// nonPublic are the ranges beyond net.IP's own classes that no public
// receiver lives in: "this network" (0.0.0.0/8, which some stacks route to
// the host itself; net.IP knows only 0.0.0.0), carrier-grade NAT (cloud
// metadata services answer in it, e.g. 100.100.100.200), IETF protocol
// assignments, benchmarking (198.18.0.0/15, 2001:2::/48), the documentation ranges (TEST-NET-1 to 3,
// 2001:db8::/32 and 3fff::/20: nothing real answers there, and a network
// may route them anywhere; QA: 192.0.2.1 was taken), the deprecated 6to4
// relay anycast, the reserved class E, and the IPv6 ranges that
// carry or translate an IPv4 address, which would reach any IPv4 address,
// private ones included (NAT64, IPv4-compatible, SIIT, 6to4, Teredo), with
// the deprecated site-local range and the discard prefix (QA: the last five
// were taken at creation).
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("::/96"),
	netip.MustParsePrefix("::ffff:0:0:0/96"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("fec0::/10"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2001:2::/48"),
	netip.MustParsePrefix("3fff::/20"),
}

// public reports whether ip may receive a webhook.
func public(ip net.IP) bool {
	if ip == nil || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast() {
		return false
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return false
	}
	addr = addr.Unmap()
	for _, p := range nonPublic {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// namesNonPublic reports whether a URL's host is, before any resolution, a
// non-public address: an IP literal public refuses, a scoped IPv6 literal
// (a zone, "fe80::1%eth0", names a link of this host: net.ParseIP reads
// none, QA), or localhost. Every dot at its end is left out, not only the
// root's one: "localhost.." and "127.0.0.1.." were taken at creation,
// where "localhost." and "127.0.0.1." were refused, and each delivery to
// them failed (webhooks QA).
func namesNonPublic(host string) bool {
	host = strings.TrimRight(strings.ToLower(asDialed(host)), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || strings.Contains(host, "%") {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		ip = shorthandIPv4(host)
	}
	return ip != nil && !public(ip)
}

// asDialed maps a host name's compatibility forms as IDNA's mapping (UTS
// #46), which the HTTP client applies before it dials, does for the
// characters an address is spelt with: fullwidth digits and letters, circled
// letters and the like (NFKC), and the ideographic, fullwidth and halfwidth
// full stops, which are dots. Creation refused 127.0.0.1 and localhost but
// took "１２７.０.０.１", "127。0。0。1" and "ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", which the client dials as
// them (security QA; the dialer's own check refused them at delivery).
func asDialed(host string) string {
	if isASCII(host) {
		return host
	}
	return strings.NewReplacer("\u3002", ".", "\uff0e", ".", "\uff61", ".").Replace(norm.NFKC.String(host))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// shorthandIPv4 reads host as the numeric IPv4 forms inet_aton accepts and
// net.ParseIP does not (127.1, 2130706433, 0x7f000001, 0177.0.0.1, 0): a
// resolver that takes them (glibc's does) dials the address they spell, so
// creation refuses them like the dotted quad they mean (QA). Nil when host
// is not such a number.
func shorthandIPv4(host string) net.IP {
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return nil
	}
	var nums []uint64
	for _, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		n, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return nil
		}
		nums = append(nums, n)
	}
	// Every part but the last is one byte; the last fills the bytes left.
	var v uint64
	for i, n := range nums[:len(nums)-1] {
		if n > 0xff {
			return nil
		}
		v |= n << (24 - 8*i)
	}
	last := nums[len(nums)-1]
	if last >= 1<<(32-8*(len(nums)-1)) {
		return nil
	}
	v |= last
	return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// sendFailure is the last_error of a send that got no answer: a fixed
// reason by the kind of failure, so that the receiver's owner can tell a
// port nothing listens on from a certificate the sender does not trust or
// a receiver too slow to answer (webhooks QA: each read "request failed").
// Never the error's own words: they hold the URL, whose query may carry
// the receiver's token, and whatever a TLS or DNS server said.
func sendFailure(err error, sendTimeout time.Duration) string {
	var (
		dns     *net.DNSError
		cert    *tls.CertificateVerificationError
		alert   tls.AlertError
		header  tls.RecordHeaderError
		timeout net.Error
		op      *net.OpError
	)
	switch {
	case errors.Is(err, errNotPublic):
		return "refused: not a public address (WEBHOOK_ALLOW_PRIVATE_NETWORKS)"
	case errors.As(err, &dns):
		return "DNS lookup of the host failed"
	case errors.As(err, &cert):
		return "TLS: the receiver's certificate is not trusted for its host"
	case errors.As(err, &alert), errors.As(err, &header), tlsAlert(err), tlsRefusal(err):
		return "TLS handshake failed"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case headersTooLarge(err):
		return answerHeadersTooLarge
	case errors.As(err, &op) && op.Op == "dial" && errors.As(err, &timeout) && timeout.Timeout():
		// The dialer's own limit, not the send's (review: a receiver
		// that never took the connection read "no answer within 10s").
		return "timed out: no connection within " + connectTimeout.String()
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &timeout) && timeout.Timeout():
		return "timed out: no answer within " + sendTimeout.String()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return "connection closed without an answer"
	}
	return "request failed"
}

// tlsAlert says whether err is a TLS alert, sent by the receiver or by us:
// over TCP crypto/tls returns one as a net.OpError whose Op is "remote
// error" or "local error" around an unexported alert type, never as a
// tls.AlertError (only QUIC's are; review: a receiver refusing the
// handshake was recorded "request failed").
func tlsAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "remote error" || op.Op == "local error")
}

// tlsRefusal says whether err ends in a handshake crypto/tls refused on
// our side (the receiver chose a protocol version or a cipher suite this
// client does not take, its key exchange was wrong): plain errors whose
// text crypto/tls starts with "tls: " (review: they read "request
// failed"). Only the prefix is read, never shown.
func tlsRefusal(err error) bool {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return strings.HasPrefix(err.Error(), "tls: ")
		}
		err = next
	}
}

// maxAnswerHeaderBytes bounds a receiver's answer's headers (newClient).
const maxAnswerHeaderBytes = 64 << 10

// answerHeadersTooLarge is the last_error of a send whose answer's headers
// passed maxAnswerHeaderBytes.
const answerHeadersTooLarge = "answer's headers over 64 KiB"

// headersTooLarge says whether err is net/http's refusal of an answer whose
// headers passed maxAnswerHeaderBytes: a plain error, told by its text's
// start (only read, never shown).
func headersTooLarge(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if strings.HasPrefix(err.Error(), "net/http: server response headers exceeded") {
			return true
		}
	}
	return false
}

// errNotPublic is the dialer's refusal of a receiver on a non-public
// address: recorded as such, so an operator sees why (sendFailure).
var errNotPublic = errors.New("webhooks: refusing to deliver to a non-public address")

// newClient returns the delivery client. Unless allowPrivate, its dialer
// refuses every non-public address (public) after DNS resolution, which
// also defeats DNS rebinding.
func newClient(allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: connectTimeout}
	if !allowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if !public(net.ParseIP(host)) {
				return errNotPublic
			}
			return nil
		}
	}
	return &http.Client{
		Timeout: sendTimeout,
		// A receiver's answer is read for its status alone, so its headers
		// are bounded as its body is (64 KiB): net/http's own bound is
		// 10 MiB, which a receiver sending that much to each of a pass's
		// 100 sends in flight held a gigabyte of the sweeper's memory for
		// (security review).
		Transport: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second,
			MaxResponseHeaderBytes: maxAnswerHeaderBytes},
		// Redirects are not followed: a receiver must answer at the URL it registered.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// postgresUTC is a timestamptz as PostgreSQL's JSON writes it in UTC.
var postgresUTC = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$`)

// utcZ writes the UTC timestamps of an event's data as every other time
// the API writes, with Z: data built in SQL (jsonb_build_object over a
// timestamptz) reads +00:00. Only the values of keys ending in _at are
// times (every time SQL writes into data is named so, and every key so
// named is a time): the data's names are sent as they are, also one that
// reads like a time (an endpoint may be named "2026-12-07T09:00:00+00:00",
// and a handler version may read so: rewritten, circuit.closed named an
// endpoint that does not exist; events QA). Data that is not a JSON
// document is sent as it is.
func utcZ(data []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return data
	}
	changed := false
	var walk func(v any, isTime bool) any
	walk = func(v any, isTime bool) any {
		switch t := v.(type) {
		case map[string]any:
			for k, e := range t {
				t[k] = walk(e, strings.HasSuffix(k, "_at"))
			}
		case []any:
			for i, e := range t {
				t[i] = walk(e, isTime)
			}
		case string:
			if isTime && postgresUTC.MatchString(t) {
				changed = true
				return strings.TrimSuffix(t, "+00:00") + "Z"
			}
		}
		return v
	}
	v = walk(v, false)
	if !changed {
		return data
	}
	out, err := json.Marshal(v)
	if err != nil {
		return data
	}
	return out
}
