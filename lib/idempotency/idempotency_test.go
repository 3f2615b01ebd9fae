package idempotency_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/testpg"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// testStore is a Store over a test database and the pool it writes answers
// to outside a request's transaction.
type testStore struct {
	*idempotency.Store
	pool *pgxpool.Pool
}

// store is a Store over a test database with its own clock, and a request
// from a fresh API key of a fresh workspace.
func store(t *testing.T, start time.Time) (testStore, *apitest.Clock, idempotency.Request) {
	t.Helper()
	clock := apitest.NewClock(start)
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	s := testStore{Store: env.App.Server.Idempotency, pool: env.App.Pool}
	req := idempotency.Request{APIKeyID: ids.New("key"), Key: "create-1", Method: "POST", Path: "/api/v1/keys",
		Body: []byte(`{"name":"a","preset":"AGENT"}`), ID: ids.New(ids.Request)}
	return s, clock, req
}

func retry(req idempotency.Request) idempotency.Request {
	req.ID = ids.New(ids.Request)
	return req
}

func TestAnsweredRequestIsAnsweredAgain(t *testing.T) {
	t.Parallel()
	s, clock, req := store(t, time.Now())
	ctx := context.Background()
	record(t, s, mustClaim(t, s, req), 201, `{"id":"key_1"}`)

	claim, stored, err := s.Begin(ctx, retry(req))
	require.NoError(t, err)
	require.Nil(t, claim)
	require.Equal(t, &idempotency.Answer{Status: 201, Body: []byte(`{"id":"key_1"}`), RequestID: req.ID}, stored)

	// The body's bytes, not their meaning: the route decodes strictly, and
	// what a lenient reader takes for the same (a repeated field, another
	// spelling of a number) may be refused (QA).
	for name, other := range map[string]func(*idempotency.Request){
		"body":      func(r *idempotency.Request) { r.Body = []byte(`{"name":"b","preset":"AGENT"}`) },
		"reordered": func(r *idempotency.Request) { r.Body = []byte(`{"preset":"AGENT","name":"a"}`) },
		"repeated":  func(r *idempotency.Request) { r.Body = []byte(`{"name":"x","name":"a","preset":"AGENT"}`) },
		"path":      func(r *idempotency.Request) { r.Path = "/api/v1/webhooks" },
		"method":    func(r *idempotency.Request) { r.Method = "PUT" },
	} {
		r := retry(req)
		other(&r)
		_, _, err := s.Begin(ctx, r)
		require.ErrorIs(t, err, idempotency.ErrReused, name)
	}

	// Another API key's keys are its own.
	mine := retry(req)
	mine.APIKeyID = ids.New("key")
	mustClaim(t, s, mine)

	// A day later the key is new, whatever the request.
	clock.Add(idempotency.TTL)
	later := retry(req)
	later.Body = []byte(`{"name":"c"}`)
	mustClaim(t, s, later)
}

func TestRefusedRequestLeavesTheKeyFree(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	require.NoError(t, mustClaim(t, s, req).GiveUp(ctx))
	corrected := retry(req)
	corrected.Body = []byte(`{"name":"a","preset":"WORKER"}`)
	mustClaim(t, s, corrected)
}

// A claim whose answer was lost (the client went away while it committed)
// is given up at once: nothing acts under it, and the retry takes the key
// instead of waiting ClaimTTL (security QA).
func TestAClaimWhoseAnswerWasLostFreesTheKey(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	lost := testStore{Store: idempotency.New(s.pool, nil, time.Now), pool: s.pool}
	idempotency.LoseClaimAnswers(lost.Store, context.Canceled)
	_, _, err := lost.Begin(context.Background(), req)
	require.ErrorIs(t, err, context.Canceled)
	mustClaim(t, s, retry(req))
}

// A claim runs to its end though its request is cancelled (the client
// reset the connection): the caller, whose context is done, then fails and
// gives it up, where a claim cancelled mid-statement could land after the
// give-up and hold the key for ClaimTTL (QA).
func TestAClaimIsNotCutByItsRequestsCancellation(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	claim, stored, err := s.Begin(ctx, req)
	require.NoError(t, err)
	require.Nil(t, stored)
	require.NoError(t, claim.GiveUp(ctx))
	mustClaim(t, s, retry(req))
}

// A request sent while the first is acting, the same or another, is
// refused until the first's claim lapses, told how long to wait (reuse
// would read as final, yet the first may do nothing and free the key);
// then any request acts (the first died, or never learnt whether its
// commit landed), and the first's late answer is not recorded over the new
// holder's.
func TestClaimHoldsTheKeyUntilItLapses(t *testing.T) {
	t.Parallel()
	s, clock, req := store(t, time.Now())
	ctx := context.Background()
	first := mustClaim(t, s, req)
	_, _, err := s.Begin(ctx, retry(req))
	var busy *idempotency.InFlightError
	require.ErrorAs(t, err, &busy)
	require.Equal(t, time.Second, busy.RetryAfter, "its request may answer at any moment")
	require.ErrorIs(t, err, idempotency.ErrInFlight)
	other := retry(req)
	other.Body = []byte(`{}`)
	_, _, err = s.Begin(ctx, other)
	require.ErrorIs(t, err, idempotency.ErrInFlight,
		"another request waits too: the first may yet do nothing and free the key for it (chaos QA)")

	clock.Add(idempotency.ActingTime + 500*time.Millisecond)
	_, _, err = s.Begin(ctx, retry(req))
	require.ErrorAs(t, err, &busy)
	require.Equal(t, 10*time.Second, busy.RetryAfter, "past its acting time: until the claim lapses, in whole seconds")

	clock.Add(idempotency.ClaimTTL - idempotency.ActingTime - 500*time.Millisecond)
	record(t, s, mustClaim(t, s, other), 201, `{"n":2}`)
	taken, err := first.Record(ctx, s.pool, idempotency.Answer{Status: 201, Body: []byte(`{"n":1}`)})
	require.NoError(t, err)
	require.True(t, taken)
	require.NoError(t, first.GiveUp(ctx), "gives up nothing of the new holder's")
	_, stored, err := s.Begin(ctx, retry(other))
	require.NoError(t, err)
	require.Equal(t, []byte(`{"n":2}`), stored.Body)
}

// A request whose COMMIT went unanswered learns whether it landed by
// waiting, on another connection, for its transaction to end (Settle):
// committed, its answer is given to the retry; rolled back, the key is
// free at once. Before, the key was held until the claim lapsed (30 s) in
// both cases (chaos QA). A transaction that does not end in time (its
// connection's network path died without a word) leaves it unknown.
func TestSettleFindsWhatBecameOfAnUnansweredCommit(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		req := retry(req)
		req.Key = fmt.Sprint("settle-", commit)
		claim := mustClaim(t, s, req)
		tx, err := s.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // or a failure waits in pool.Close
		taken, err := claim.Record(ctx, tx, idempotency.Answer{Status: 201, Body: []byte(`{"n":1}`)})
		require.NoError(t, err)
		require.False(t, taken)
		type settled struct {
			landed bool
			err    error
		}
		done := make(chan settled, 1)
		go func() {
			landed, err := claim.Settle(ctx)
			done <- settled{landed, err}
		}()
		waitsFor(t, s.pool, tx, done)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, commit, r.landed)
		if commit {
			_, stored, err := s.Begin(ctx, retry(req))
			require.NoError(t, err)
			require.Equal(t, []byte(`{"n":1}`), stored.Body)
		} else {
			mustClaim(t, s, retry(req))
		}
	}

	claim := mustClaim(t, s, req)
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // a Settle that hung waits no longer
	_, err = claim.Record(ctx, tx, idempotency.Answer{Status: 201, Body: []byte(`{"n":1}`)})
	require.NoError(t, err)
	// The transaction ends only after Settle returned: a Settle that
	// waited for the row rather than give up at SettleTimeout hangs.
	apitest.Returns(t, "Settle waited for the row instead of giving up", func() { _, err = claim.Settle(ctx) })
	require.Error(t, err, "the transaction never ended")
	require.ErrorIs(t, err, context.DeadlineExceeded, "gave up at SettleTimeout")
	// Its give-up may still be waiting for the row (its cancel is sent
	// apart): it frees nothing of a transaction that then commits.
	require.NoError(t, tx.Commit(ctx))
	_, stored, err := s.Begin(ctx, retry(req))
	require.NoError(t, err)
	require.Equal(t, []byte(`{"n":1}`), stored.Body)
}

// waitsFor waits until a statement waits for a lock tx holds, failing the
// test if done (the waiting call's answer) is sent first: the call under
// test is then known to wait for tx, with no time window guessed.
func waitsFor[T any](t *testing.T, pool *pgxpool.Pool, tx pgx.Tx, done <-chan T) {
	t.Helper()
	pid := tx.Conn().PgConn().PID()
	for {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))`, pid).Scan(&n))
		if n > 0 {
			return
		}
		select {
		case r := <-done:
			t.Fatalf("answered %+v without waiting for the open transaction", r)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// mustClaim begins req and requires that it claims the key.
func mustClaim(t *testing.T, s testStore, req idempotency.Request) *idempotency.Claim {
	t.Helper()
	claim, stored, err := s.Begin(context.Background(), req)
	require.NoError(t, err)
	require.Nil(t, stored)
	require.NotNil(t, claim)
	return claim
}

func record(t *testing.T, s testStore, c *idempotency.Claim, status int, body string) {
	t.Helper()
	taken, err := c.Record(context.Background(), s.pool, idempotency.Answer{Status: status, Body: []byte(body)})
	require.NoError(t, err)
	require.False(t, taken)
}

// Purge deletes answers a day old. In its own era (1999): a purge acts on
// every test's rows.
func TestPurgeDeletesDayOldAnswers(t *testing.T) {
	t.Parallel()
	s, clock, req := store(t, time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	answer := func(r idempotency.Request, body string) { record(t, s, mustClaim(t, s, r), 201, body) }
	answer(req, `{"n":1}`)
	clock.Add(time.Hour)
	young := retry(req)
	young.Key = "create-2"
	answer(young, `{"n":2}`)

	clock.Add(idempotency.TTL - time.Hour)
	n, err := s.Purge(ctx, clock.Now(), 1000)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, stored, err := s.Begin(ctx, retry(young))
	require.NoError(t, err)
	require.Equal(t, []byte(`{"n":2}`), stored.Body, "an hour younger: kept")
	n, err = s.Purge(ctx, clock.Now(), 1000)
	require.NoError(t, err)
	require.Zero(t, n)
}

// An answer recorded with the resource whose secret it shows is erased by
// EraseAnswers for that resource, in the deleting transaction: the same
// request is then told ErrErased (naming the request that acted) rather
// than given the secret or acted on again, another request under the key
// is still refused, and the row keeps no sealed answer. An answer naming
// another resource, or none, is kept.
func TestAnAnswerIsErasedWithTheResourceItNames(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	hook := ids.New(ids.Webhook)
	linked := func(r idempotency.Request, resource, body string) {
		taken, err := mustClaim(t, s, r).Record(ctx, s.pool, idempotency.Answer{Status: 201, Body: []byte(body),
			Resource: resource})
		require.NoError(t, err)
		require.False(t, taken)
	}
	linked(req, hook, `{"id":"`+hook+`","secret":"whsec_1"}`)
	other := req
	other.Key, other.ID = "create-2", ids.New(ids.Request)
	linked(other, ids.New(ids.Webhook), `{"secret":"whsec_2"}`)
	plain := req
	plain.Key, plain.ID = "create-3", ids.New(ids.Request)
	record(t, s, mustClaim(t, s, plain), 201, `{"id":"key_1"}`)

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	tag, err := tx.Exec(ctx, idempotency.EraseAnswers("resource_id = $1::text"), hook)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	require.NoError(t, tx.Commit(ctx))

	_, _, err = s.Begin(ctx, retry(req))
	var erased *idempotency.ErasedError
	require.ErrorAs(t, err, &erased)
	require.ErrorIs(t, err, idempotency.ErrErased)
	require.Equal(t, req.ID, erased.RequestID)
	reused := retry(req)
	reused.Body = []byte(`{}`)
	_, _, err = s.Begin(ctx, reused)
	require.ErrorIs(t, err, idempotency.ErrReused, "the key stays used")

	var status int
	var answer []byte
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT status, answer FROM idempotent_requests
		WHERE key_id = $1 AND idempotency_key = $2`, req.APIKeyID, req.Key).Scan(&status, &answer))
	require.Equal(t, idempotency.ErasedStatus, status)
	require.Nil(t, answer, "no sealed answer is left")

	for _, r := range []idempotency.Request{other, plain} {
		_, stored, err := s.Begin(ctx, retry(r))
		require.NoError(t, err)
		require.NotNil(t, stored, r.Key)
	}
}

// recordEach records body as the answer of req under each of keys; their
// rows go when the test ends.
func recordEach(t *testing.T, s testStore, req idempotency.Request, body string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		r := req
		r.Key, r.ID = k, ids.New(ids.Request)
		record(t, s, mustClaim(t, s, r), 201, body)
	}
	t.Cleanup(func() {
		_, err := s.pool.Exec(context.Background(), `DELETE FROM idempotent_requests WHERE key_id = $1`, req.APIKeyID)
		require.NoError(t, err)
	})
}

// unlinkOldestFirst makes API key apiKeyID's answers read as the release
// before migration 0067 recorded them (naming no resource), first (the
// oldest of every test's, in 2000) those of keys in order, then the rest.
func unlinkOldestFirst(t *testing.T, s testStore, apiKeyID string, keys ...string) {
	t.Helper()
	_, err := s.pool.Exec(context.Background(), `UPDATE idempotent_requests SET resource_id = NULL,
		created_at = timestamptz '2000-01-01 00:00:00Z'
		    + coalesce(array_position($2::text[], idempotency_key), cardinality($2::text[]) + 1) * interval '1 second'
		WHERE key_id = $1`, apiKeyID, keys)
	require.NoError(t, err)
}

// resourcesOf is what each answer kept for API key apiKeyID is linked to, by
// its idempotency key (nil: not linked).
func resourcesOf(t *testing.T, s testStore, apiKeyID string) map[string]*string {
	t.Helper()
	rows, err := s.pool.Query(context.Background(),
		`SELECT idempotency_key, resource_id FROM idempotent_requests WHERE key_id = $1`, apiKeyID)
	require.NoError(t, err)
	out := map[string]*string{}
	for rows.Next() {
		var key string
		var resource *string
		require.NoError(t, rows.Scan(&key, &resource))
		out[key] = resource
	}
	require.NoError(t, rows.Err())
	return out
}

// The answers recorded before migration 0067 name no resource (NULL):
// LinkAnswers opens each and links it to the resource whose secret its
// body shows, or records that it shows none (empty), as Record does now; an
// answer recorded since is never read again.
func TestAnswersRecordedBeforeTheirLinkAreLinked(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	hook := ids.New(ids.Webhook)
	record(t, s, mustClaim(t, s, req), 201, `{"id":"`+hook+`","secret":"whsec_1"}`)
	plain := req
	plain.Key, plain.ID = "create-2", ids.New(ids.Request)
	record(t, s, mustClaim(t, s, plain), 201, `{"id":"key_1"}`)
	resources := func() map[string]*string { return resourcesOf(t, s, req.APIKeyID) }
	sealedElsewhere := req
	sealedElsewhere.Key, sealedElsewhere.ID = "create-3", ids.New(ids.Request)
	record(t, s, mustClaim(t, s, sealedElsewhere), 201, `{"id":"`+hook+`","secret":"whsec_2"}`)
	none := ""
	require.Equal(t, map[string]*string{req.Key: &none, plain.Key: &none, sealedElsewhere.Key: &none}, resources(),
		"recorded as showing none")

	_, err := s.pool.Exec(ctx, `UPDATE idempotent_requests SET resource_id = NULL WHERE key_id = $1`, req.APIKeyID)
	require.NoError(t, err) // as the release before 0067 recorded them
	// An answer this instance cannot open (sealed under a key it lacks) is
	// left unlinked, for an instance that has the key, and the others are
	// linked all the same.
	_, err = s.pool.Exec(ctx, `UPDATE idempotent_requests SET answer = '\x00'::bytea
		WHERE key_id = $1 AND idempotency_key = $2`, req.APIKeyID, sealedElsewhere.Key)
	require.NoError(t, err)
	secretOf := func(body []byte) string {
		if strings.Contains(string(body), `"secret"`) {
			return hook
		}
		return ""
	}
	_, err = s.LinkAnswers(ctx, 1000, secretOf)
	require.NoError(t, err)
	require.Equal(t, map[string]*string{req.Key: &hook, plain.Key: &none, sealedElsewhere.Key: nil}, resources())
	_, stored, err := s.Begin(ctx, retry(req))
	require.NoError(t, err)
	require.Equal(t, `{"id":"`+hook+`","secret":"whsec_1"}`, string(stored.Body), "linked, not erased")
}

// Answers this instance cannot open (sealed under a key it lacks) do not
// hold up the ones behind them: a pass read the oldest limit of them, linked
// none, and read the same ones at every pass after (review), so a later
// answer stayed unlinked, its secret kept past its resource's delete. Not
// parallel: LinkAnswers reads every test's rows, and these come first.
func TestAnswersNoInstanceHereCanOpenDoNotHoldUpTheRest(t *testing.T) {
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	hook := ids.New(ids.Webhook)
	held := []string{"held-1", "held-2"}
	recordEach(t, s, req, `{"id":"`+hook+`","secret":"whsec_1"}`, append(held, req.Key)...)
	// As the release before 0067 recorded them, the held ones first and
	// under a key this instance lacks.
	unlinkOldestFirst(t, s, req.APIKeyID, held...)
	elsewhere, err := seal.New(bytes.Repeat([]byte{0xee}, 32))
	require.NoError(t, err)
	for _, k := range held {
		_, err := s.pool.Exec(ctx, `UPDATE idempotent_requests SET answer = $3 WHERE key_id = $1 AND idempotency_key = $2`,
			req.APIKeyID, k, elsewhere.Seal([]byte(`{"id":"`+hook+`","secret":"whsec_1"}`),
				idempotency.AnswerAAD(req.APIKeyID, k)))
		require.NoError(t, err)
	}
	secretOf := func([]byte) string { return hook }
	for range 2 {
		_, err = s.LinkAnswers(ctx, len(held), secretOf)
		require.NoError(t, err)
	}
	var linked *string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT resource_id FROM idempotent_requests
		WHERE key_id = $1 AND idempotency_key = $2`, req.APIKeyID, req.Key).Scan(&linked))
	require.NotNil(t, linked, "linked behind the answers it cannot open")
	require.Equal(t, hook, *linked)
}

// Answers sealed under a key this instance has that fail authentication
// (one damaged, one copied from another row) are linked as showing no
// secret: nothing opens them, and left unlinked they came first at every
// pass and held the answers behind them unlinked (review), secrets
// included. Not parallel: LinkAnswers reads every test's rows, and these
// come first.
func TestDamagedAnswersDoNotHoldUpTheRest(t *testing.T) {
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	hook := ids.New(ids.Webhook)
	damaged, copied := "damaged-1", "copied-1"
	recordEach(t, s, req, `{"id":"`+hook+`","secret":"whsec_1"}`, damaged, copied, req.Key)
	// One with its last byte flipped, one holding another row's answer.
	_, err := s.pool.Exec(ctx, `UPDATE idempotent_requests
		SET answer = set_byte(answer, length(answer) - 1, get_byte(answer, length(answer) - 1) # 1)
		WHERE key_id = $1 AND idempotency_key = $2`, req.APIKeyID, damaged)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `UPDATE idempotent_requests SET answer = (SELECT answer FROM idempotent_requests
		WHERE key_id = $1 AND idempotency_key = $3) WHERE key_id = $1 AND idempotency_key = $2`,
		req.APIKeyID, copied, req.Key)
	require.NoError(t, err)
	for _, k := range []string{damaged, copied} {
		r := retry(req)
		r.Key = k
		_, _, err := s.Begin(ctx, r)
		require.ErrorContains(t, err, "failed authentication", "%s: damaged under a configured key", k)
	}
	// As the release before 0067 recorded them, the damaged ones first.
	unlinkOldestFirst(t, s, req.APIKeyID, damaged, copied)
	secretOf := func([]byte) string { return hook }
	for range 2 {
		_, err = s.LinkAnswers(ctx, 2, secretOf)
		require.NoError(t, err)
	}
	none := ""
	require.Equal(t, map[string]*string{damaged: &none, copied: &none, req.Key: &hook}, resourcesOf(t, s, req.APIKeyID),
		"the damaged ones linked as showing no secret, the one behind them linked to its resource")
}

// LinkAnswers reads the answers kept before migration 0067 through
// idempotent_requests_unlinked_idx: once they are linked, a pass reads
// none of the day of answers recorded since (20,000 here), in both plan
// cache modes.
func TestLinkAnswersReadsTheUnlinkedOnly(t *testing.T) {
	t.Parallel()
	s, _, _ := store(t, time.Now())
	ctx := context.Background()
	tx := answersScratch(t, s, 20000, "now() - g * interval '1 second'", "CASE WHEN g % 1000 = 0 THEN NULL ELSE '' END")
	for _, mode := range testpg.PlanCacheModes {
		read, _, err := testpg.RowsRead(ctx, tx, mode, idempotency.SQLUnlinked, 1000, [][]byte{{0x01, 0xaa}})
		require.NoError(t, err, mode)
		require.LessOrEqual(t, read["idempotent_requests"], 40, "%s: rows of idempotent_requests read", mode)
	}
}

// A purge reads the batch it deletes, not the answers kept, however it is
// planned (scale QA: deleted through a join on the key, each batch of
// 1,000 read every answer kept, a hash of the batch probed by a scan of
// the table: 100,000 answers read 51 times in a pass).
func TestPurgeReadsTheBatchItDeletes(t *testing.T) {
	t.Parallel()
	s, _, _ := store(t, time.Now())
	ctx := context.Background()
	// 20,000 answers older than a day, then 40,000 newer.
	tx := answersScratch(t, s, 60000, "now() - interval '2 days' + g * interval '2 second'", "''")
	const limit = 1000
	for _, mode := range testpg.PlanCacheModes {
		read, nodes, err := testpg.RowsRead(ctx, tx, mode, idempotency.SQLPurge, time.Now().Add(-idempotency.TTL), limit)
		require.NoError(t, err, mode)
		require.LessOrEqual(t, read["idempotent_requests"], 2*limit, "%s: rows of idempotent_requests read: %v", mode,
			testpg.Reads(nodes, "idempotent_requests"))
	}
}

// answersScratch is a scratch copy (testpg.Scratch) of idempotent_requests
// holding n answers of key key_plan, the g-th (from 1) recorded at
// createdAt and linked to resourceID (SQL expressions of g).
func answersScratch(t *testing.T, s testStore, n int, createdAt, resourceID string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, s.pool, "idempotent_requests")
	_, err := tx.Exec(ctx, `
		INSERT INTO idempotent_requests (key_id, idempotency_key, request_hash, request_id, status, answer, created_at,
		    resource_id)
		SELECT 'key_plan', 'k' || g, '\x00', 'req_' || g, 201, '\x01aa', `+createdAt+`, `+resourceID+`
		FROM generate_series(1, `+strconv.Itoa(n)+`) g;
		ANALYZE idempotent_requests;`)
	require.NoError(t, err)
	return tx
}

// SecretShownBy names the resource whose secret an answer shows by its
// id's prefix and its secret's together: a key's create and a webhook's are
// each linked to their own, and an answer whose id and secret are of two
// kinds (or that shows no secret, or is no object) to none, so that one
// kind's id never names another's resource.
func TestSecretShownByTellsTheKindsApart(t *testing.T) {
	t.Parallel()
	key, hook := ids.New(ids.Key), ids.New(ids.Webhook)
	shownBy := idempotency.SecretShownBy(idempotency.SecretKind{IDPrefix: ids.Key, SecretPrefix: "rk_"},
		idempotency.SecretKind{IDPrefix: ids.Webhook, SecretPrefix: "whsec_"})
	for body, want := range map[string]string{
		`{"id":"` + key + `","secret":"rk_1"}`:     key,
		`{"id":"` + hook + `","secret":"whsec_1"}`: hook,
		`{"id":"` + hook + `","secret":"rk_1"}`:    "",
		`{"id":"` + key + `","secret":"whsec_1"}`:  "",
		`{"id":"` + key + `"}`:                     "",
		`{"id":"run_1","secret":"rk_1"}`:           "",
		`[1]`:                                      "",
	} {
		require.Equal(t, want, shownBy([]byte(body)), "%s", body)
	}
}
