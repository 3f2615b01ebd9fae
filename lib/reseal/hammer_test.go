package reseal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// A rolling deploy under load: one instance still runs the settings before
// a rotation (the old key alone), one the new ones (the new key sealing,
// the old one kept), and workers claim through both at once, long polls
// and claims sent again under their claimId (an answer lost, the claim
// resent through the other instance) among them, while jobs are enqueued
// through both. Every job is worked exactly once, on its first attempt;
// no claim the lagging instance answers holds a job it cannot open; no
// claim answers 5xx except the lagging instance's documented give-up (a
// claim that met only such jobs for four rounds) and a resent claim whose
// held jobs it cannot open (it cannot answer them; sent again through the
// updated instance, the claim answers them); nothing leased is lost. With
// the skip rounds off (maxSkipRounds 1) it fails at once.
func TestRollingDeployClaimHammer(t *testing.T) {
	const (
		runs, stepsPerRun = 12, 25 // 300 jobs, 40% sealed under the new key
		workersPerSide    = 12
	)
	var lagLogs, updLogs apitest.LockedBuffer
	lagging := fresh(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&lagLogs, nil))))
	updated := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&updLogs, nil))),
		apitest.WithConfig(func(c *config.Config) {
			c.ResultEncryptionKey, c.ResultEncryptionKeys = newKey, []string{oldKey}
		}))
	ws := lagging.Signup()
	envs := [2]*apitest.Env{lagging, updated}
	const lag, upd = 0, 1
	name := [2]string{"lagging", "updated"}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a watchdog: 4-25 s here, 2 min ran out once under -race at load 16
	defer cancel()
	h := &hammer{ctx: ctx, key: ws.Key}

	// The jobs, by id: the step key in its input and whether the new key
	// sealed it. Filled by the producer while the workers run.
	var mu sync.Mutex
	newKeyed := map[string]bool{}
	stepOf := map[string]string{}
	type answer struct {
		instance int
		attempt  any
		step     any // the input's step key
	}
	answered := map[string]answer{} // each job's first answer
	var fails []string              // what broke an invariant, said at the end
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(fails) < 20 {
			fails = append(fails, fmt.Sprintf(format, args...))
		}
		cancel() // the workers stop: the jobs left would never all be worked
	}
	var worked atomic.Int64
	total := int64(runs * stepsPerRun)

	var workerIDs []string
	for range 2 * workersPerSide {
		workerIDs = append(workerIDs, registerSender(t, lagging, ws))
	}
	runIDs := make([]string, runs)
	for i := range runIDs {
		runIDs[i] = lagging.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key,
			map[string]any{"name": "r"}).JSON()["id"].(string)
	}

	var giveUps, heldUnreadable atomic.Int64
	var wg sync.WaitGroup
	// The producer: eight steps in twenty through the updated instance
	// (sealed under the new key), the rest through the lagging one, a few
	// at a time so that long polls are woken or find work on their next
	// look.
	wg.Go(func() {
		for i := range runs * stepsPerRun {
			via := lag
			if i%20 < 8 { // in runs of eight: a claim of the lagging one may meet only them for four rounds
				via = upd
			}
			k := fmt.Sprintf("s%03d", i)
			r, err := h.do(envs[via], "POST", "/api/v1/runs/"+runIDs[i%runs]+"/steps", map[string]any{
				"name": "send", "version": "1", "idempotencyKey": "step:" + k, "input": map[string]any{"step": k},
				"maxAttempts": 1})
			if err != nil || r.status != http.StatusCreated {
				failf("enqueue %s through the %s instance: %v %d %s", k, name[via], err, r.status, r.body)
				cancel()
				return
			}
			mu.Lock()
			id := r.json["jobId"].(string)
			newKeyed[id], stepOf[id] = via == upd, k
			mu.Unlock()
			if i%10 == 9 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	})

	for w, wid := range workerIDs {
		home := w % 2
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		wg.Go(func() {
			for worked.Load() < total && ctx.Err() == nil {
				inst := home
				body := map[string]any{"limit": 1 + rng.IntN(3)}
				if rng.IntN(3) == 0 {
					body["waitSeconds"] = 1
				}
				keyed := rng.IntN(2) == 0
				if keyed {
					body["claimId"] = fmt.Sprintf("c-%d-%d", w, rng.Uint64())
				}
				passedBefore := passedOver(&lagLogs, wid)
				r, err := h.do(envs[inst], "POST", "/api/v1/workers/"+wid+"/claim", body)
				if err != nil {
					if ctx.Err() == nil {
						failf("claim through the %s instance: %v", name[inst], err)
					}
					return
				}
				if r.status >= 500 {
					// Only the documented give-up: four rounds, each meeting
					// jobs this instance cannot open (three rounds logged,
					// the fourth fails), the claim rolled back.
					passed := passedOver(&lagLogs, wid)[len(passedBefore):]
					if inst != lag || r.status != http.StatusInternalServerError || len(passed) < 3 {
						failf("claim through the %s instance answered %d (%s), %d jobs passed over", name[inst],
							r.status, r.body, len(passed))
						continue
					}
					requireLogged(&lagLogs, r.requestID, "claim: open input of job ", failf)
					giveUps.Add(1)
					continue
				}
				if r.status != http.StatusOK {
					failf("claim through the %s instance answered %d (%s)", name[inst], r.status, r.body)
					continue
				}
				jobs := r.json["jobs"].([]any)
				if keyed && len(jobs) > 0 && rng.IntN(4) == 0 {
					// The answer lost: the claim is sent again under its id,
					// through the other instance, and then, if that one
					// cannot answer it, through the updated one.
					first := jobs
					for _, via := range []int{1 - inst, upd} {
						again, err := h.do(envs[via], "POST", "/api/v1/workers/"+wid+"/claim", body)
						if err != nil {
							failf("claim sent again through the %s instance: %v", name[via], err)
							return
						}
						if again.status == http.StatusOK {
							jobs, inst = again.json["jobs"].([]any), via
							break
						}
						if via != lag || again.status != http.StatusInternalServerError {
							failf("claim sent again through the %s instance answered %d (%s)", name[via],
								again.status, again.body)
							return
						}
						requireLogged(&lagLogs, again.requestID, "claim: open input of job ", failf)
						heldUnreadable.Add(1)
					}
					if !sameLeases(first, jobs) {
						failf("claim sent again answered %v, first %v", jobs, first)
						return
					}
				}
				for _, j := range jobs {
					job := j.(map[string]any)
					id, token := job["jobId"].(string), job["leaseToken"].(string)
					step := job["input"].(map[string]any)["step"]
					mu.Lock()
					prev, seen := answered[id]
					if !seen {
						answered[id] = answer{inst, job["attempt"], step}
					}
					mu.Unlock()
					if seen {
						failf("job %s answered again (%s, then %s)", id, name[prev.instance], name[inst])
					}
					if rng.IntN(4) == 0 {
						via := rng.IntN(2)
						hb, err := h.do(envs[via], "POST", "/api/v1/jobs/"+id+"/heartbeat", map[string]any{"leaseToken": token})
						if err != nil || hb.status != http.StatusOK {
							failf("heartbeat of %s through the %s instance: %v %d %s", id, name[via], err, hb.status, hb.body)
						}
					}
					via := rng.IntN(2)
					rep, err := h.do(envs[via], "POST", "/api/v1/jobs/"+id+"/report", map[string]any{
						"leaseToken": token, "status": "SUCCEEDED", "output": map[string]any{"step": step}})
					if err != nil || rep.status != http.StatusOK || rep.json["status"] != "SUCCEEDED" {
						failf("report of %s through the %s instance: %v %d %s", id, name[via], err, rep.status, rep.body)
						continue
					}
					worked.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, fails)
	require.Equal(t, total, worked.Load(), "every job worked")
	t.Logf("%d jobs passed over, %d claims gave up, %d resent claims held jobs the lagging instance cannot open",
		len(passedOverLine.FindAllString(lagLogs.String(), -1)), giveUps.Load(), heldUnreadable.Load())

	// In the database: every job succeeded on its one attempt, with one
	// execution, reported, under the token its claim answered.
	rows, err := lagging.App.Pool.Query(context.Background(), `SELECT j.id, j.status, j.attempt, count(x.*),
	    count(x.*) FILTER (WHERE x.outcome = 'SUCCEEDED' AND x.reported_at IS NOT NULL)
	    FROM jobs j LEFT JOIN job_executions x ON x.job_id = j.id WHERE j.workspace_id = $1 GROUP BY j.id`, ws.ID)
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		var id, status string
		var attempt, executions, succeeded int
		require.NoError(t, rows.Scan(&id, &status, &attempt, &executions, &succeeded))
		require.Equal(t, "SUCCEEDED", status, id)
		require.Equal(t, 1, attempt, id)
		require.Equal(t, 1, executions, id)
		require.Equal(t, 1, succeeded, id)
		n++
	}
	require.NoError(t, rows.Err())
	require.EqualValues(t, total, n)
	// Each job's one answer: its input, its first attempt, and a job
	// sealed under the new key answered by the updated instance only.
	require.Len(t, answered, int(total))
	for id, a := range answered {
		require.Equal(t, stepOf[id], a.step, id)
		require.Equal(t, float64(1), a.attempt, id)
		if newKeyed[id] {
			require.Equal(t, upd, a.instance, "job %s sealed under the new key", id)
		}
	}
	// The lagging instance passed over only jobs sealed under the new key;
	// the updated one passed over none and failed nothing.
	for _, m := range passedOverLine.FindAllStringSubmatch(lagLogs.String(), -1) {
		require.True(t, newKeyed[m[1]], "the lagging instance passed over job %s, sealed under the old key", m[1])
	}
	require.NotContains(t, updLogs.String(), "passed over")
	require.NotContains(t, updLogs.String(), "level=ERROR")
}

// hammer sends requests from many goroutines: unlike apitest.Env.Do it
// answers errors instead of failing the test from a goroutine.
type hammer struct {
	ctx context.Context
	key string
}

type reply struct {
	status    int
	body      []byte
	json      map[string]any
	requestID string
}

func (h *hammer) do(env *apitest.Env, method, path string, body any) (reply, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	req, err := http.NewRequestWithContext(h.ctx, method, env.Server.URL+path, bytes.NewReader(raw))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := env.Client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	r := reply{status: res.StatusCode, requestID: res.Header.Get("X-Request-Id")}
	if r.body, err = io.ReadAll(res.Body); err != nil {
		return r, err
	}
	_ = json.Unmarshal(r.body, &r.json)
	return r, nil
}

var passedOverLine = regexp.MustCompile(`msg="claim passed over a job whose input this instance cannot open" job_id=(\S+) worker_id=(\S+)`)

// passedOver lists, in order, the jobs the lagging instance's claims for
// worker wid passed over so far. One goroutine claims for each worker, so
// the lines a claim adds are its own.
func passedOver(logs *apitest.LockedBuffer, wid string) []string {
	var ids []string
	for _, m := range passedOverLine.FindAllStringSubmatch(logs.String(), -1) {
		if m[2] == wid {
			ids = append(ids, m[1])
		}
	}
	return ids
}

// requireLogged checks that the request's internal error was logged, its
// error starting with prefix: a claim that met inputs it cannot open.
func requireLogged(logs *apitest.LockedBuffer, requestID, prefix string, failf func(string, ...any)) {
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "request_id="+requestID+" ") && strings.Contains(line, `msg="internal error"`) {
			if !strings.Contains(line, ` err="`+prefix) {
				failf("internal error of claim %s: %s", requestID, line)
			}
			return
		}
	}
	failf("no internal error logged for claim %s", requestID)
}

// sameLeases says whether two claim answers hold the same jobs under the
// same lease tokens.
func sameLeases(a, b []any) bool {
	tokens := func(js []any) map[string]any {
		m := map[string]any{}
		for _, j := range js {
			m[j.(map[string]any)["jobId"].(string)] = j.(map[string]any)["leaseToken"]
		}
		return m
	}
	ta, tb := tokens(a), tokens(b)
	if len(ta) != len(tb) {
		return false
	}
	for id, tok := range ta {
		if tb[id] != tok {
			return false
		}
	}
	return true
}
