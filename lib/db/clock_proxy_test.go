package db_test

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slowProxy stands between a test and its database (sslmode=disable, so
// that the first thing a client sends is its startup message). A
// connection it accepts while delay is set waits that long before reaching
// the database (a slow connect); one it accepts while stall is set reaches
// it, but the first statement sent on it is never forwarded (a pooler with
// no server free, or a network path that died after the handshake): the
// client waits for an answer that does not come. One it accepts while
// refuse is set it closes at once (a database that refuses connections).
type slowProxy struct {
	url    string
	delay  atomic.Int64 // nanoseconds
	stall  atomic.Bool
	refuse atomic.Bool
	dials  atomic.Int32 // connections accepted

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startSlowProxy(t *testing.T, connString string) *slowProxy {
	t.Helper()
	u, err := url.Parse(connString)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &slowProxy{ln: ln}
	through := *u
	through.Host = ln.Addr().String()
	p.url = through.String()
	go p.serve(u.Host)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *slowProxy) serve(upstream string) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.dials.Add(1)
		if p.refuse.Load() {
			c.Close()
			continue
		}
		delay, stall := time.Duration(p.delay.Load()), p.stall.Load()
		go func() {
			time.Sleep(delay)
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(c, up); c.Close(); up.Close() }()
			if !stall {
				_, _ = io.Copy(up, c)
			} else {
				forwardUntilStatement(c, up)
				_, _ = io.Copy(io.Discard, c) // held: never forwarded
			}
			up.Close()
			c.Close()
		}()
	}
}

// forwardUntilStatement forwards the startup message and what follows it
// (a password, say) up to the first statement: a simple Query or an
// extended Parse, which it leaves unsent.
func forwardUntilStatement(c, up net.Conn) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return
	}
	startup := make([]byte, binary.BigEndian.Uint32(n[:])-4)
	if _, err := io.ReadFull(c, startup); err != nil {
		return
	}
	if _, err := up.Write(append(n[:], startup...)); err != nil {
		return
	}
	for {
		var h [5]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		if h[0] == 'Q' || h[0] == 'P' {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(h[1:])-4)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		if _, err := up.Write(append(h[:], body...)); err != nil {
			return
		}
	}
}
