package testpg

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
)

// CutProxy is a TCP proxy in front of a test database whose connections can
// be closed at once from the middle, as a crashed server or a reset network
// path would end them (each side sees its connection end, with no word from
// the other): tests use it to see what a statement in flight answers.
type CutProxy struct {
	// URL is the database's connection string through the proxy.
	URL string

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	// dropCancels: cancel requests are not passed on.
	dropCancels bool
}

// DropCancelRequests stops passing cancel requests on: a client whose
// connection was cut asks the server to cancel what that connection ran
// (pgx does, on a new connection), and on a network path that died its
// request does not arrive either. Without it a COMMIT cut while it ran
// was cancelled before it could land.
func (p *CutProxy) DropCancelRequests() {
	p.mu.Lock()
	p.dropCancels = true
	p.mu.Unlock()
}

// cancelRequestCode opens a cancel request (its length, 16, comes first).
const cancelRequestCode = 80877102

// StartCutProxy proxies the database that connString names.
func StartCutProxy(connString string) (*CutProxy, error) {
	u, err := url.Parse(connString)
	if err != nil {
		return nil, fmt.Errorf("cut proxy: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cut proxy: %w", err)
	}
	p := &CutProxy{ln: ln}
	through := *u
	through.Host = ln.Addr().String()
	p.URL = through.String()
	go p.serve(u.Host)
	return p, nil
}

func (p *CutProxy) serve(upstream string) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pass(c, upstream)
	}
}

// pass joins c to a new connection to upstream.
func (p *CutProxy) pass(c net.Conn, upstream string) {
	p.mu.Lock()
	dropCancels := p.dropCancels
	p.mu.Unlock()
	var first []byte
	if dropCancels {
		// The first message's length and code: a startup message, an SSL
		// or GSS request, or a cancel request.
		first = make([]byte, 8)
		if _, err := io.ReadFull(c, first); err != nil ||
			(binary.BigEndian.Uint32(first) == 16 && binary.BigEndian.Uint32(first[4:]) == cancelRequestCode) {
			c.Close()
			return
		}
	}
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		c.Close()
		return
	}
	if _, err := up.Write(first); err != nil {
		c.Close()
		up.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	// Either side's end ends both, as a TCP connection would.
	go func() { _, _ = io.Copy(up, c); up.Close(); c.Close() }()
	go func() { _, _ = io.Copy(c, up); c.Close(); up.Close() }()
}

// Cut closes every connection made so far, both ways, without a word to
// either side. New connections are still accepted.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Close cuts every connection and stops accepting.
func (p *CutProxy) Close() {
	p.ln.Close()
	p.Cut()
}
