package testpg

import (
	"net"
	"sync/atomic"
	"testing"
)

// Silent is a Postgres server that accepts connections and never answers
// (StartSilent), or hangs up on each at once (StartHangUp): a path to the
// database that died without a word, or a database that refuses every
// connection, for tests of what waits on it or how often it dials. It
// counts the connections it accepted; it closes with the test.
type Silent struct {
	URL   string
	dials atomic.Int32
}

// Dials is how many connections the server accepted. A connection is
// counted before a hung-up one is closed, so a client that saw its
// connection fail sees it counted.
func (s *Silent) Dials() int { return int(s.dials.Load()) }

// SilentURL is StartSilent's URL.
func SilentURL(t testing.TB) string {
	t.Helper()
	return StartSilent(t).URL
}

// StartSilent starts a server that holds every connection open and never
// reads from it.
func StartSilent(t testing.TB) *Silent {
	t.Helper()
	return startSilent(t, false)
}

// StartHangUp starts a server that closes every connection as it accepts
// it: a connect fails at once, without waiting for a timeout.
func StartHangUp(t testing.TB) *Silent {
	t.Helper()
	return startSilent(t, true)
}

func startSilent(t testing.TB, hangUp bool) *Silent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testpg: silent listener: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	s := &Silent{URL: "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable"}
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.dials.Add(1)
			if hangUp {
				_ = c.Close()
				continue
			}
			conns = append(conns, c) // held open, never read
		}
	}()
	return s
}
