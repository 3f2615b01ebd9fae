package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// pprofAddrEnv names the address the local server serves its Go profiles
// on (net/http/pprof under /debug/pprof/), for scripts/soak's -pprof and
// `go tool pprof`: unset (the default), none is served. Only this command
// imports net/http/pprof: the Lambda functions and the Vercel ones never
// serve profiles, and the API's port never does.
const pprofAddrEnv = "RATCHET_PPROF_ADDR"

// pprofAllowRemoteEnv, set true (1, true), lets RATCHET_PPROF_ADDR name an
// address that is not loopback. The profiles show the process's command
// line, its stacks and its memory (a heap profile's strings), without any
// key: served on every interface by a slip of the address (":6060"), they
// were anyone's on the network (hygiene QA: the README only warned).
const pprofAllowRemoteEnv = "RATCHET_PPROF_ALLOW_REMOTE"

// pprofAddr reads RATCHET_PPROF_ADDR ("" when no profiles are served) and
// refuses, unless RATCHET_PPROF_ALLOW_REMOTE allows it, an address whose
// host is not loopback (127.0.0.0/8, ::1, localhost): an empty host, as in
// ":6060", is every interface. The server stops at start with the error,
// before it waits on its database.
func pprofAddr() (addr string, allowRemote bool, err error) {
	addr = os.Getenv(pprofAddrEnv)
	if v := os.Getenv(pprofAllowRemoteEnv); v != "" {
		if allowRemote, err = strconv.ParseBool(v); err != nil {
			return "", false, fmt.Errorf("%s is malformed (1 to serve profiles off loopback; unset or 0 not to)",
				pprofAllowRemoteEnv)
		}
	}
	if addr == "" {
		return "", false, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false, fmt.Errorf("%s %q is malformed (host:port, e.g. 127.0.0.1:6060)", pprofAddrEnv, addr)
	}
	if !allowRemote && !loopbackHost(host) {
		return "", false, offLoopback(addr, port)
	}
	return addr, allowRemote, nil
}

// loopbackHost says whether host, an address's, is loopback: localhost, or
// an IP address in 127.0.0.0/8 or ::1. An empty host is every interface.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// offLoopback is the refusal of a profiles address that is not loopback,
// saying why and what to do, on one line.
func offLoopback(addr, port string) error {
	return fmt.Errorf("%s %q is not a loopback address (an empty host is every interface): the Go profiles show "+
		"the process's command line, stacks and memory to whoever reaches them; use 127.0.0.1:%s (or [::1]:%s, "+
		"localhost:%s), or set %s=1 to serve them there anyway", pprofAddrEnv, addr, port, port, port,
		pprofAllowRemoteEnv)
}

// servePprof serves the profiles on their own listener at addr (from
// pprofAddr; none when it is empty), and says where on logOut. A name that
// resolved off loopback is refused as pprofAddr refuses an address, unless
// allowRemote. It answers the function that stops it (a no-op when none is
// served).
func servePprof(logOut io.Writer, addr string, allowRemote bool) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %q: %w", pprofAddrEnv, addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !allowRemote && !tcp.IP.IsLoopback() {
		// localhost named another address (/etc/hosts).
		ln.Close()
		return nil, offLoopback(addr, strconv.Itoa(tcp.Port))
	}
	// A mux of its own, not http.DefaultServeMux, which the package's
	// import fills for whatever serves it.
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// No WriteTimeout: a CPU profile or a trace takes its ?seconds= to
	// write.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(logOut, "ratchet: pprof stopped: %v\n", err)
		}
	}()
	fmt.Fprintf(logOut, "ratchet: Go profiles on http://%s/debug/pprof/ (%s)\n", ln.Addr(), pprofAddrEnv)
	return func() {
		// A profile being taken is cut: the server is stopping.
		_ = srv.Close()
		<-served
	}, nil
}
