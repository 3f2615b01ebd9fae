package gate_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"math"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// tripCounter stands between an instance and its database (sslmode=disable)
// and counts the round trips the instance asks for: each Sync of the
// extended protocol and each simple Query is one wait for the server.
type tripCounter struct {
	url   string
	trips atomic.Int64
}

func startTripCounter(t testing.TB, connString string) *tripCounter {
	t.Helper()
	u, err := url.Parse(connString)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tc := &tripCounter{}
	through := *u
	through.Host = ln.Addr().String()
	tc.url = through.String()
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", u.Host)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go func() { _, _ = io.Copy(c, up); c.Close(); up.Close() }()
			go tc.forward(c, up)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return tc
}

// forward copies the client's messages upstream, counting Syncs and
// Queries. The startup message has no type byte.
func (tc *tripCounter) forward(c, up net.Conn) {
	defer c.Close()
	defer up.Close()
	r := bufio.NewReader(c)
	var head [5]byte
	if _, err := io.ReadFull(r, head[:4]); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(head[:4])
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return
	}
	if _, err := up.Write(append(head[:4:4], body...)); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[1:])
		body := make([]byte, n-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if head[0] == 'S' || head[0] == 'Q' {
			tc.trips.Add(1)
		}
		if _, err := up.Write(append(head[:], body...)); err != nil {
			return
		}
	}
}

// startCounted starts an instance whose database round trips tc counts.
func startCounted(t testing.TB) (*apitest.Env, *tripCounter) {
	tc := startTripCounter(t, apitest.DatabaseURL(t))
	return apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.DatabaseURL = tc.url })), tc
}

// TestGateCycleRoundTrips: begin on a new key, its report, and a duplicate
// begin each cost one round trip to the database (README: "one function
// call"), once the key's authentication is cached: the per-cycle cost that
// issue 6's gate figure pays twice.
func TestGateCycleRoundTrips(t *testing.T) {
	env, tc := startCounted(t)
	ws := env.Signup()
	trips := func(f func()) int64 {
		before := tc.trips.Load()
		f()
		return tc.trips.Load() - before
	}
	cycle := func(k string) (begin, report int64) {
		var d map[string]any
		begin = trips(func() {
			var status int
			var err error
			status, d, err = post(env, "/api/v1/effects/begin", ws.Key, email(k))
			require.NoError(t, err)
			require.Equal(t, 200, status, d)
			require.Equal(t, "execute", d["decision"])
		})
		report = trips(func() {
			status, out, err := post(env, "/api/v1/effects/"+str(d["effect_id"])+"/report", ws.Key,
				map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": map[string]any{"id": 1}})
			require.NoError(t, err)
			require.Equal(t, 200, status, out)
		})
		return begin, report
	}
	cycle(key("warm")) // the key's authentication, cached from now on
	// The fewest of a few tries: a connection idle over a second is pinged
	// at its handout, and the database's clock is read at most once a
	// minute (db.Clock), each a round trip a loaded machine may add to one
	// of them.
	least := [3]int64{math.MaxInt64, math.MaxInt64, math.MaxInt64}
	for i := 0; i < 5; i++ {
		k := key("trips")
		begin, report := cycle(k)
		dup := trips(func() {
			status, d, err := post(env, "/api/v1/effects/begin", ws.Key, email(k))
			require.NoError(t, err)
			require.Equal(t, "duplicate", d["decision"], status)
		})
		least = [3]int64{min(least[0], begin), min(least[1], report), min(least[2], dup)}
	}
	require.EqualValues(t, 1, least[0], "round trips of a begin on a new key")
	require.EqualValues(t, 1, least[1], "round trips of its report")
	require.EqualValues(t, 1, least[2], "round trips of a duplicate begin")
}
