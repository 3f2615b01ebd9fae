package webhooks

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestPublicRefusesEveryNonPublicRange(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
		"0.0.0.0", "0.0.0.1", "0.255.255.255", "192.0.0.170", "100.64.0.1", "100.100.100.200", "198.18.0.1", "198.19.255.255", "240.0.0.1",
		"255.255.255.254", "::1", "fe80::1", "fc00::1", "::ffff:10.0.0.1", "::ffff:100.100.100.200",
		"64:ff9b::a00:1", "64:ff9b:1::1", "224.0.0.1",
		"::127.0.0.1", "::ffff:0:127.0.0.1", "fec0::1", "2002:7f00:1::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
		"100::1", "192.0.2.1", "198.51.100.7", "203.0.113.255", "192.88.99.1", "2001:db8::1", "3fff::1", "2001:2::1", "2001:2:0:ffff::1",
		"3fff:fff:ffff::1"} {
		if public(net.ParseIP(s)) {
			t.Errorf("%s is public", s)
		}
	}
	for _, s := range []string{"93.184.216.34", "8.8.8.8", "100.63.255.255", "100.128.0.1",
		"192.0.3.1", "198.51.101.1", "203.0.114.1", "2001:db9::1", "3fff:1000::1", "2001:3::1", "2606:2800:220:1::1",
		"2001:4860:4860::8888", "2a00:1450:4001::1"} {
		if !public(net.ParseIP(s)) {
			t.Errorf("%s is not public", s)
		}
	}
}

// The numeric shorthands a resolver may dial read as the address they spell.
func TestShorthandIPv4(t *testing.T) {
	for host, want := range map[string]string{
		"127.1": "127.0.0.1", "2130706433": "127.0.0.1", "0x7f000001": "127.0.0.1", "0177.0.0.1": "127.0.0.1",
		"0": "0.0.0.0", "10.0x10.1": "10.16.0.1", "169.254.43518": "169.254.169.254", "8.8.8.8": "8.8.8.8",
	} {
		if got := shorthandIPv4(host); got == nil || got.String() != want {
			t.Errorf("shorthandIPv4(%q) = %v, want %s", host, got, want)
		}
	}
	for _, host := range []string{"example.com", "1.2.3.4.5", "256.1", "1.2.3.256", "4294967296", "08", "0x", "1..2",
		"", "1.2.65536", "-1", "0xfg"} {
		if got := shorthandIPv4(host); got != nil {
			t.Errorf("shorthandIPv4(%q) = %v, want none", host, got)
		}
	}
}

func TestUTCZWritesTimestampsAsTheAPIDoes(t *testing.T) {
	in := `{"effect_id":"eff_1","opened_at":"2026-11-30T15:16:15.414274+00:00","n":9007199254740993,` +
		`"closes_at":null,"seen_at":["2026-11-30T15:16:15+00:00","note +00:00"],"at":"2026-11-30T15:16:15+01:00",` +
		`"endpoint":"2026-11-30T15:16:15+00:00","list":["2026-11-30T15:16:15+00:00"]}`
	got := string(utcZ([]byte(in)))
	// Only the values of keys ending _at are times: a name that reads like
	// one is sent as it is (events QA).
	want := `{"at":"2026-11-30T15:16:15+01:00","closes_at":null,"effect_id":"eff_1",` +
		`"endpoint":"2026-11-30T15:16:15+00:00","list":["2026-11-30T15:16:15+00:00"],"n":9007199254740993,` +
		`"opened_at":"2026-11-30T15:16:15.414274Z","seen_at":["2026-11-30T15:16:15Z","note +00:00"]}`
	if got != want {
		t.Fatalf("utcZ:\n got %s\nwant %s", got, want)
	}
	if same := `{"a":1.50}`; string(utcZ([]byte(same))) != same {
		t.Fatal("data without such a time is sent as it is")
	}
}

// A scoped IPv6 literal names a link of this host, whatever its address.
func TestNamesNonPublicRefusesZones(t *testing.T) {
	for _, host := range []string{"fe80::1%lo", "fe80::1%25lo", "2606:2800:220:1::1%eth0", "localhost", "127.1", "::1"} {
		if !namesNonPublic(host) {
			t.Errorf("%s is taken as public", host)
		}
	}
	if namesNonPublic("example.com") || namesNonPublic("93.184.216.34") {
		t.Error("a public host is refused")
	}
}

// A send that got no answer is recorded by its kind of failure, in words
// of the sender's own (the error's hold the URL and what servers said).
func TestSendFailureSaysWhichKind(t *testing.T) {
	secretURL := "https://hooks.example.com/x?token=receiver-secret"
	wrap := func(err error) error { return &url.Error{Op: "Post", URL: secretURL, Err: err} }
	dial := func(err error) error { return wrap(&net.OpError{Op: "dial", Net: "tcp", Err: err}) }
	for _, c := range []struct {
		err  error
		want string
	}{
		{dial(errNotPublic), "refused: not a public address (WEBHOOK_ALLOW_PRIVATE_NETWORKS)"},
		{dial(&net.DNSError{Err: "no such host", Name: "hooks.example.com", IsNotFound: true}), "DNS lookup of the host failed"},
		{dial(&net.DNSError{Err: "i/o timeout", Name: "hooks.example.com", IsTimeout: true}), "DNS lookup of the host failed"},
		{wrap(context.DeadlineExceeded), "timed out: no answer within 10s"},
		{dial(timeoutError{}), "timed out: no connection within 5s"},
		{wrap(&net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}), "timed out: no answer within 10s"},
		{wrap(tls.AlertError(40)), "TLS handshake failed"},
		{wrap(errors.New("tls: server selected unsupported protocol version 301")), "TLS handshake failed"},
		{wrap(errors.New("tls: server chose an unconfigured cipher suite")), "TLS handshake failed"},
		{dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), "connection refused"},
		{wrap(io.EOF), "connection closed without an answer"},
		{wrap(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}),
			"connection closed without an answer"},
		{wrap(errors.New("net/http: HTTP/1.x transport connection broken: malformed HTTP response")), "request failed"},
	} {
		got := sendFailure(c.err, sendTimeout)
		if got != c.want {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
		if strings.Contains(got, "receiver-secret") || strings.Contains(got, "hooks.example.com") {
			t.Errorf("%q says the URL", got)
		}
	}
	// The timeout named is the send's own (a test raises it).
	if got := sendFailure(wrap(context.DeadlineExceeded), time.Hour); got != "timed out: no answer within 1h0m0s" {
		t.Errorf("a send given an hour: %q", got)
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// A receiver that refuses the TLS handshake sends an alert, which
// crypto/tls returns as a net.OpError ("remote error") around an
// unexported alert, never a tls.AlertError (only QUIC's are): each such
// send was recorded "request failed" (review). The delivery client meets
// real receivers here, on ports of the system's choosing.
func TestSendFailureSaysTLSHandshakeFailedOnAlerts(t *testing.T) {
	for name, cfg := range map[string]*tls.Config{
		"protocol version": {MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11},
		"no cipher suite":  {MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}},
	} {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		srv.TLS = cfg
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.StartTLS()
		res, err := newClient(true).Post(srv.URL, "application/json", strings.NewReader("{}"))
		srv.Close()
		if err == nil {
			res.Body.Close()
			t.Fatalf("%s: the handshake succeeded", name)
		}
		if got := sendFailure(err, sendTimeout); got != "TLS handshake failed" {
			t.Errorf("%s: %v recorded %q, want %q", name, err, got, "TLS handshake failed")
		}
	}
}

// A receiver's answer is read for its status alone, so its headers are
// bounded as its body is: net/http's own bound is 10 MiB, which a receiver
// answering that much to each send in flight held a gigabyte of the
// sweeper's memory for (security review). An answer past 64 KiB of headers
// fails the attempt, said so in last_error; one within it is taken.
func TestAReceiversAnswerHeadersAreBounded(t *testing.T) {
	for _, c := range []struct {
		headers int // of 1 KiB each
		fails   bool
	}{{headers: 32}, {headers: 2048, fails: true}} {
		value := strings.Repeat("x", 1000)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			for i := range c.headers {
				w.Header().Set("X-Pad-"+strconv.Itoa(i), value)
			}
			w.WriteHeader(http.StatusOK)
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		res, err := newClient(true).Post(srv.URL, "application/json", strings.NewReader("{}"))
		srv.Close()
		if !c.fails {
			if err != nil {
				t.Fatalf("%d headers: %v", c.headers, err)
			}
			res.Body.Close()
			continue
		}
		if err == nil {
			res.Body.Close()
			t.Fatalf("%d KiB of headers were taken (status %d)", c.headers, res.StatusCode)
		}
		if got := sendFailure(err, sendTimeout); got != "answer's headers over 64 KiB" {
			t.Errorf("%v recorded %q", err, got)
		}
	}
}

// A delivery goes to the URL its subscription names and nowhere else
// (security review, a receiver that sends it on): a redirect is answered
// as the receiver's status, never followed (the signed body would reach
// a host the subscription does not name), and no proxy from the
// environment is used (one would dial the receiver itself, past the
// dialer's check of the address it connects to, and the check would
// judge the proxy's address instead). HTTP_PROXY cannot be set here to
// show it: net/http reads the environment once a process, and never for
// a loopback receiver, so the transport itself is checked.
func TestADeliveryFollowsNoRedirectAndTakesNoProxy(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect,
		http.StatusPermanentRedirect} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/taken", status)
		}))
		res, err := newClient(true).Post(srv.URL, "application/json", strings.NewReader("{}"))
		srv.Close()
		if err != nil {
			t.Fatalf("%d: %v", status, err)
		}
		res.Body.Close()
		if res.StatusCode != status {
			t.Errorf("a %d redirect read %d", status, res.StatusCode)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirects were followed: %d requests reached the other host", n)
	}
	for _, allowPrivate := range []bool{false, true} {
		if tr := newClient(allowPrivate).Transport.(*http.Transport); tr.Proxy != nil {
			t.Errorf("allowPrivate %v: the delivery client takes a proxy", allowPrivate)
		}
	}
}
