package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/testpg"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// TestDatabaseCrashesLoseNothingAcknowledged holds the same promises as
// TestCrashesLoseNothingAcknowledged across crashes of the database rather
// than of the server: the real local server runs in this process (sweeper
// on) over a PostgreSQL cluster of the test's own (testpg's Crashable:
// never the shared server), with producers, two SDK workers, gate callers
// (DoEffect) and callers minting keys under Idempotency-Key at it, and the
// cluster is stopped with `pg_ctl stop -m immediate` two or three times
// during the traffic, kept down a second or three and started again (crash
// recovery), at moments drawn from a seeded RNG (CRASH_SEED replays one).
// While it is down the server answers 503 database_unavailable and never a
// 2xx to a write; once it is back the same server, its sweeper and the same
// workers carry on with no restart of theirs; once the traffic has settled
// every acknowledged enqueue, report and key is recorded, no gate key was
// acted on twice, nothing stays leased, and the server logged no panic, no
// error and no caller's value.
func TestDatabaseCrashesLoseNothingAcknowledged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := testpg.Crashable(t, ctx)
	rng, seed := crashRNG(t)
	logs := &apitest.LockedBuffer{}
	base := startOverDatabase(t, pg.URL, logs)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CRASH_SEED=%d; the server's log:\n%s", seed, logs.String())
		}
	})
	began := time.Now()

	seen := newCrashLog(&http.Transport{MaxIdleConnsPerHost: 32})
	watch := &outageWatch{next: seen, phantoms: map[string]int{}, otherWhileDown: map[string]int{}}
	set := setUpCrashTraffic(t, ctx, base, watch, "dbcrash")
	c, run, operatorKey, wsID, operator := set.clients, set.run, set.operatorKey, set.wsID, set.operator
	stopWorkers := set.stopWorkers
	defer stopWorkers()
	minter := &keyMinter{ctx: ctx, operator: operator, minted: map[string][]ratchet.NewAPIKey{}}

	stopNew := make(chan struct{})
	trafficDone := c.drive(stopNew)
	mintingDone := minter.drive(stopNew)
	crashes := crashDatabaseDuring(t, ctx, pg, watch, base, rng)
	c.awaitADeath(t)
	close(stopNew)
	trafficDone()
	mintingDone()
	require.NoError(t, ctx.Err(), "the traffic finished: every call was answered")
	t.Logf("traffic done at %s", time.Since(began).Round(time.Millisecond))
	// The sweeper saw each outage begin and end: it outlived them all.
	// (Causal: the line comes from its first whole pass after each restart.
	// A far bound, as the leases it must lapse would hide a dead sweeper
	// behind ctx's two minutes.)
	for seen := time.Now(); strings.Count(logs.String(), "sweep: database available again") < crashes; {
		require.Less(t, time.Since(seen), 30*time.Second,
			"the sweeper never said the database was back after each of %d crashes", crashes)
		time.Sleep(50 * time.Millisecond)
	}

	// Recovered with no restart of anything but the database: the same
	// producers, gate callers and minters were answered 2xx again, the
	// same workers work every job to its end, and the same sweeper makes
	// every lease a crash left behind lapse.
	require.True(t, set.workersRunning(), "no worker gave up on the database")
	_, err := c.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	waitRunEnded(t, ctx, c.producer, run.ID)
	stopWorkers()
	t.Logf("run finished at %s", time.Since(began).Round(time.Millisecond))
	conn, err := pgx.Connect(ctx, pg.URL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	reader, err := ratchet.NewClient(ratchet.Config{BaseURL: base, APIKey: operatorKey})
	require.NoError(t, err)
	check := &crashCheck{t: t, ctx: ctx, ws: wsID, db: conn, api: reader}
	check.settled()
	t.Logf("settled at %s", time.Since(began).Round(time.Millisecond))

	seen.mu.Lock()
	defer seen.mu.Unlock()
	watch.mu.Lock()
	defer watch.mu.Unlock()
	t.Logf("%d crashes; answers not 2xx: %v; calls made again after the SDK gave up: %d; gate keys blocked: %d; "+
		"503 database_unavailable answered while down: %d; writes acknowledged after the last restart: %d",
		crashes, seen.failures, c.gaveUp.Load(), c.blocked.Load(), watch.unavailable, watch.writesAfterLast)
	require.Zero(t, seen.failures["transport error"], "the server, up throughout, answered every call: %q",
		seen.transportErrs)
	require.Empty(t, watch.phantoms, "a write sent and answered while the database was down was acknowledged")
	require.Empty(t, watch.otherWhileDown, "while the database was down every call was answered 503 database_unavailable")
	require.Positive(t, watch.unavailable, "calls were made while the database was down")
	require.Positive(t, watch.writesAfterLast, "writes were acknowledged again after the last restart")
	require.Empty(t, seen.leaky5xx, "a 5xx carries nothing but its request id")
	for failure := range seen.failures {
		if failure == "cancelled by its caller" || failure == "cut by its caller's deadline" {
			continue // the caller's own doing, not an answer (crashLog.RoundTrip); CI met one
		}
		status, _, _ := strings.Cut(failure, " ")
		require.Contains(t, []string{"503", "409"}, status, "an answer the outage explains: %s", failure)
		if status == "503" {
			require.Contains(t, failure, "database_unavailable", failure)
		}
	}
	check.jobs(run.ID, c.jobKeys.list, seen, &c.handled)
	check.gate(c.gateKeys.list, seen, &c.acted, &c.died)
	secrets := minter.check(t, ctx, conn, wsID, func(secret string) *ratchet.Client {
		k, err := ratchet.NewClient(ratchet.Config{BaseURL: base, APIKey: secret})
		require.NoError(t, err)
		return k
	})

	out := logs.String()
	for _, line := range strings.Split(out, "\n") {
		for _, bad := range []string{"panic", "DATA RACE", "level=ERROR"} {
			require.NotContains(t, line, bad, "the server logged what a database crash must not cause")
		}
	}
	var keys []string
	for _, list := range [][]string{c.jobKeys.list, c.gateKeys.list} {
		keys = append(keys, list...)
	}
	for _, key := range keys {
		require.NotContains(t, out, `"`+key+`"`, "a caller's key or payload in the log")
	}
	apitest.RequireNoLeak(t, out, secrets, "sweep task interrupted: database unavailable")
}

// startOverDatabase runs the local server in this process over the
// database at url, sweeping every 100 ms and with a 1 s job lease grace,
// logging to logs; it stops when the test ends.
func startOverDatabase(t *testing.T, url string, logs *apitest.LockedBuffer) (base string) {
	localEnv(t)
	t.Setenv("DATABASE_URL", url)
	t.Setenv("PORT", strconv.Itoa(freePort(t)))
	t.Setenv("SWEEP_INTERVAL", "100ms")
	t.Setenv("JOB_LEASE_GRACE_MS", "1000")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, logs, ready) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case addr := <-ready:
		return "http://" + addr
	case err := <-done:
		t.Fatalf("the server exited: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the server did not start")
	}
	return ""
}

// dbCrashTrafficFor is how long new keys are handed out; the crashes all
// fall within it.
const dbCrashTrafficFor = 8 * time.Second

// crashDatabaseDuring crashes the database 2 or 3 times within
// dbCrashTrafficFor, at moments drawn from rng, keeps it down 1 to 2 s
// (once for 2.5 to 3 s, past the gate's 2 s leases), and starts it again;
// it returns how many crashes there were. Once each crash is done it asks
// the server's health, which must answer 503, and once each restart is
// done it waits until health answers 200.
func crashDatabaseDuring(t *testing.T, ctx context.Context, pg *testpg.Cluster, watch *outageWatch, base string,
	rng *rand.Rand) int {
	crashes := 2 + rng.IntN(2)
	long := rng.IntN(crashes)
	gap := dbCrashTrafficFor / time.Duration(crashes+1)
	for k := range crashes {
		time.Sleep(gap/2 + time.Duration(rng.Int64N(int64(gap/2))))
		require.NoError(t, pg.Crash(ctx))
		watch.setDown(true, k == crashes-1)
		require.Equal(t, http.StatusServiceUnavailable, healthStatus(t, base), "health while the database is down")
		down := time.Second + time.Duration(rng.IntN(1000))*time.Millisecond
		if k == long {
			down = 2500*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond
		}
		crashed := time.Now()
		time.Sleep(down)
		watch.setDown(false, k == crashes-1)
		require.NoError(t, pg.Restart(ctx))
		for healthStatus(t, base) != http.StatusOK {
			// A far bound: the server's connections are opened afresh
			// at once; ctx's two minutes would hide a pool that never
			// recovers behind a timeout of the whole test.
			require.Less(t, time.Since(crashed), down+30*time.Second, "the server never found the database again")
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("crash %d of %d: down %s, healthy again after %s", k+1, crashes, down,
			time.Since(crashed).Round(time.Millisecond))
	}
	time.Sleep(gap / 2)
	return crashes
}

func healthStatus(t *testing.T, base string) int {
	res, err := http.Get(base + "/api/v1/health")
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

// outageWatch sorts the answers to calls sent and answered while the
// database was down (between a crash's end and the restart's start, the
// same outage throughout): nothing can have been committed then, so a
// write must not be answered 2xx, and every answer must be 503
// database_unavailable. It also counts the writes acknowledged that were
// sent after the last restart.
type outageWatch struct {
	next http.RoundTripper

	mu              sync.Mutex
	down            bool
	outage          int  // crashes so far
	last            bool // the last restart has begun
	unavailable     int
	phantoms        map[string]int // 2xx answers to writes, by route and status
	otherWhileDown  map[string]int // answers but 503 database_unavailable, by route, status and code
	writesAfterLast int
}

// setDown says the database is down (after a crash) or about to come back
// (before a restart); last: this is the last crash.
func (w *outageWatch) setDown(down, last bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.down = down
	if down {
		w.outage++
	} else {
		w.last = last
	}
}

func (w *outageWatch) RoundTrip(r *http.Request) (*http.Response, error) {
	w.mu.Lock()
	sentDown, outage, afterLast := w.down, w.outage, w.last
	w.mu.Unlock()
	return apitest.Tee(w.next, r, func(r *http.Request, _ []byte, res *http.Response, body []byte) {
		w.mu.Lock()
		defer w.mu.Unlock()
		ok := res.StatusCode >= 200 && res.StatusCode <= 299
		write := r.Method != http.MethodGet
		path := crashIDs.ReplaceAllString(r.URL.Path, "…")
		switch {
		case sentDown && w.down && w.outage == outage:
			var env struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(body, &env)
			switch {
			case ok && write:
				w.phantoms[fmt.Sprint(r.Method, " ", path, " ", res.StatusCode)]++
			case res.StatusCode == http.StatusServiceUnavailable && env.Error.Code == "database_unavailable":
				w.unavailable++
			default:
				w.otherWhileDown[fmt.Sprint(r.Method, " ", path, " ", res.StatusCode, " ", env.Error.Code)]++
			}
		case afterLast && ok && write:
			w.writesAfterLast++
		}
	}, func(error) {})
}

// keyMinter mints keys under Idempotency-Key (CreateKeyWithKey), each
// idempotency key by one caller or, every third, by two at once, made again
// as a client would when the SDK gives up, until answered.
type keyMinter struct {
	ctx      context.Context
	operator *ratchet.Client
	keys     crashKeys

	mu     sync.Mutex
	minted map[string][]ratchet.NewAPIKey // idempotency key → every 2xx answer
}

func (m *keyMinter) drive(stop chan struct{}) (wait func()) {
	var done sync.WaitGroup
	done.Go(func() {
		m.keys.hand(stop, "dbcrash-mint", 3, func(key string, i int) {
			for m.ctx.Err() == nil {
				k, err := m.operator.CreateKeyWithKey(m.ctx, ratchet.KeySpec{Name: apitest.Marked("key", i),
					Preset: "AGENT"}, key)
				if err == nil {
					m.mu.Lock()
					m.minted[key] = append(m.minted[key], *k)
					m.mu.Unlock()
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	})
	return done.Wait
}

// check holds the minted keys to their acknowledgements: every idempotency
// key handed out minted one key, every answer under it named that key and
// secret, the key is stored and its secret works; it returns the secrets.
func (m *keyMinter) check(t *testing.T, ctx context.Context, conn *pgx.Conn, ws string,
	as func(secret string) *ratchet.Client) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var secrets []string
	for _, key := range m.keys.list {
		answers := m.minted[key]
		require.NotEmpty(t, answers, "minting under %s was acknowledged in the end", key)
		for _, a := range answers[1:] {
			require.Equal(t, answers[0].ID, a.ID, "every answer under %s names one key", key)
			require.Equal(t, answers[0].Secret, a.Secret, "every answer under %s gives its one secret", key)
		}
		current, err := as(answers[0].Secret).CurrentKey(ctx)
		require.NoError(t, err, "the key minted under %s works", key)
		require.Equal(t, answers[0].ID, current.ID, key)
		secrets = append(secrets, answers[0].Secret)
	}
	var stored int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE workspace_id = $1 AND name LIKE $2`,
		ws, apitest.Mark+"_key_%").Scan(&stored))
	require.Equal(t, len(m.keys.list), stored, "one key stored per idempotency key, and no other")
	t.Logf("keys: %d minted under Idempotency-Key", stored)
	return secrets
}
