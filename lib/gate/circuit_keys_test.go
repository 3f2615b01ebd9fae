package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

// Every trip of a surge breaker and every close by a policy turning surge
// off is announced, even when the breaker opens again at the instant it
// opened before, as it did when the instances' clocks lagged: a surge trips
// at T through one instance, the policy turns surge off through another
// whose clock reads a second earlier, surge is turned on again, and the
// next trip through the first instance opens the breaker at T again. That
// close now starts the next allowance after the keys begun at T
// (closeFromSQL), so the breaker cannot open at T again that way: the
// allowance is set back to the lagging close's reading here, where it
// started before, so that the keys begun at T count in it, to keep the
// events' keys from resting on the clock. Three such cycles, the last two
// tripped by a new key (gate_begin) or by a refused key begun again (an
// arrival): three circuit.tripped and three circuit.closed. Keyed by when
// the breaker opened, each cycle took the first's keys, and its trip and
// close were not recorded.
func TestEverySurgeTripAtTheSameInstantIsAnnounced(t *testing.T) {
	t.Parallel()
	for _, trip := range []string{"new key", "arrival"} {
		t.Run(trip, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			lagging := apitest.Start(t, apitest.WithNow(func() time.Time { return b.clock.Now().Add(-time.Second) }))
			refused := b.tripSurge(3) // at T, by refused[0]
			opened := b.circuit("sms.send")["opened_at"]
			surgeOff := func(closed int) {
				lagging.Must(http.StatusOK, "PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"surge_per_hour": nil})
				require.Equal(t, closed, b.events("circuit.closed"))
				_, err := b.env.App.Pool.Exec(t.Context(), `UPDATE gate_circuits SET allowance_from = $3
					WHERE workspace_id = $1 AND effect_type = $2`, b.ws.ID, "sms.send", b.clock.Now().Add(-time.Second))
				require.NoError(t, err)
			}
			for cycle := 2; cycle <= 3; cycle++ {
				surgeOff(cycle - 1)
				b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2})
				if trip == "new key" {
					b.denialOf("circuit_open", sms(key("again")))
				} else {
					b.denialOf("circuit_open", sms(refused[cycle-1]))
				}
				require.Equal(t, opened, b.circuit("sms.send")["opened_at"], "opened at the same instant again")
				require.Equal(t, cycle, b.events("circuit.tripped"))
			}
			surgeOff(3)
		})
	}
}

// Every close of a surge breaker whose cooldown ended is announced, by the
// sweeper, a new key's begin, an arrival or an operator's opening, even
// when the breaker had opened at the instant an earlier cycle of it had,
// each closed the same way. A trip's clock is moved after the allowance's
// start in the type's surge turn, and every trip is made in it (a PUT
// turning surge on cannot land between a begin's two reads of the policy:
// TestABeginAndAPolicyTurningSurgeOnTakeTurns), but the keys must not rest
// on the clock: here gate_begin is called outside the turn, through an
// instance whose clock lags past the cooldown, and trips the breaker at
// the instant the last cycle opened. Keyed by when the breaker opened, the
// second close took the first's key and was not recorded.
func TestEveryLapsedCloseAtTheSameOpeningIsAnnounced(t *testing.T) {
	// Not parallel, in its own era (1943): SweepCircuits closes every
	// workspace's lapsed breakers. Its effects, some leased, go when it
	// ends (raceEra): a later era's lapse sweep or retention pass counted
	// them (TestSweeperAndLapseRaces and TestRetentionPurgesEndedEffectsAfterTheirTypesDays
	// run after it alone, or with -count=2, failed).
	for _, closer := range []string{"sweeper", "new key", "arrival", "operator"} {
		t.Run(closer, func(t *testing.T) {
			b := raceEra(t, 1943)
			closeAtEnd(b)
			refused := b.tripSurge(3) // at T
			tripped := b.clock.Now()
			// closeLapsed closes the breaker, its cooldown over, as closer
			// does, and answers how many keys it counted in the allowance.
			closeLapsed := func(arrival string) int {
				b.clock.Add(61 * time.Second) // surge_cooldown_seconds 60
				switch closer {
				case "sweeper":
					_, err := b.env.App.Server.Gate.SweepCircuits(t.Context(), b.clock.Now(), 500)
					require.NoError(t, err)
				case "new key":
					b.begin(sms(key("after")))
					return 1
				case "arrival":
					b.begin(sms(arrival))
					return 1
				case "operator":
					b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
						map[string]any{"action": "monitor"})
				}
				return 0
			}
			counted := closeLapsed(refused[1])
			require.Equal(t, 1, b.events("circuit.closed"))
			if closer == "operator" {
				b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
			}
			for ; counted < 2; counted++ {
				b.mustBegin("execute", sms(key("allowance"))) // the allowance's two keys: the next trips
			}

			trips := b.events("circuit.tripped")
			var answered bool
			require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT true FROM gate_begin($1::text,
				'sms.send', $2::text, NULL::bigint, '{}'::text[], NULL::int, 'fp', $3::timestamptz, $4::text, '{}'::jsonb,
				NULL::bytea, NULL::jsonb, '\x00'::bytea, $5::text, $6::text, NULL::text, NULL::text, NULL::bytea, NULL::text,
				$7::text, NULL::bigint, NULL::text, $8::text)`, b.ws.ID, key("lagging"), tripped, ids.New(ids.Effect),
				keyID(b.ws.Key), ids.New(ids.Approval), ids.New(ids.Event), ids.New(ids.Event)).Scan(&answered))
			var opened time.Time
			require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT opened_at FROM gate_circuits
				WHERE workspace_id = $1 AND effect_type = 'sms.send' AND state = 'open'`, b.ws.ID).Scan(&opened))
			require.True(t, tripped.Equal(opened), "opened at the same instant again: %v", opened)
			require.Equal(t, trips+1, b.events("circuit.tripped"))

			closed := b.events("circuit.closed")
			closeLapsed(refused[2])
			require.Equal(t, closed+1, b.events("circuit.closed"))
		})
	}
}

// Each event's key is its own, so a close is announced once because only
// one racer closes the row, not because a second event took the first's
// key: a surge breaker whose cooldown ended, closed at once by two
// instances' sweepers, and by begins of new keys and of refused keys
// (arrivals) through both instances, each closing it in the type's surge
// turn first, is announced closed once. The begins over the fresh
// allowance trip it once more (one circuit.tripped), and each key is
// decided once.
func TestALapsedSurgeBreakerClosedByRacersIsAnnouncedOnce(t *testing.T) {
	// Not parallel, in its own era (1944): SweepCircuits closes every
	// workspace's lapsed breakers. Its effects, some leased, go when it
	// ends (raceEra): a later era's lapse sweep or retention pass counted
	// them (TestSweeperAndLapseRaces and TestRetentionPurgesEndedEffectsAfterTheirTypesDays
	// run after it alone, or with -count=2, failed).
	b := raceEra(t, 1944)
	closeAtEnd(b)
	c := b.clock
	refused := b.tripSurge(10)
	c.Add(61 * time.Second) // surge_cooldown_seconds 60
	envs := []*apitest.Env{b.env, apitest.Start(t, apitest.WithNow(c.Now))}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		fails []string
	)
	for i := range 30 {
		wg.Go(func() {
			<-start
			k := key("new")
			if i < len(refused) {
				k = refused[i]
			}
			status, out, err := postBegin(envs[i%2], b.ws.Key, sms(k))
			if err != nil || (status != http.StatusOK && status != http.StatusForbidden) {
				mu.Lock()
				fails = append(fails, fmt.Sprint(status, out, err))
				mu.Unlock()
			}
		})
	}
	for i := range 4 {
		wg.Go(func() {
			<-start
			if _, err := envs[i%2].App.Server.Gate.SweepCircuits(t.Context(), c.Now(), 500); err != nil {
				mu.Lock()
				fails = append(fails, err.Error())
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	require.Empty(t, fails)
	require.Equal(t, 1, b.events("circuit.closed"))
	require.Equal(t, 2, b.events("circuit.tripped"))
}

// closeAtEnd closes b's workspace's breakers when the test ends: left open
// in a past era, they were lapsed for every later test's sweep, which
// counts the breakers it closes.
func closeAtEnd(b *bundle) {
	b.t.Cleanup(func() {
		_, err := b.env.App.Pool.Exec(context.Background(), `UPDATE gate_circuits SET state = 'closed'
			WHERE workspace_id = $1`, b.ws.ID)
		require.NoError(b.t, err)
	})
}
