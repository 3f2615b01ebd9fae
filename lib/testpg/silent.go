package testpg

import (
	"net"
	"testing"
)

// SilentURL is a Postgres URL whose server accepts connections and never
// answers: a path to the database that died without a word, for tests of
// what waits on it. The listener closes with the test.
func SilentURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testpg: silent listener: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
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
			conns = append(conns, c) // held open, never read
		}
	}()
	return "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable"
}
