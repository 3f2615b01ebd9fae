package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// pprofAddrEnv names the address the local server serves its Go profiles
// on (net/http/pprof under /debug/pprof/), for scripts/soak's -pprof and
// `go tool pprof`: unset (the default), none is served. Only this command
// imports net/http/pprof: the Lambda functions and the Vercel ones never
// serve profiles, and the API's port never does.
const pprofAddrEnv = "RATCHET_PPROF_ADDR"

// servePprof serves the profiles on their own listener when
// RATCHET_PPROF_ADDR is set, and says where on logOut. It answers the
// function that stops it (a no-op when none is served).
func servePprof(logOut io.Writer) (stop func(), err error) {
	addr := os.Getenv(pprofAddrEnv)
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %q: %w", pprofAddrEnv, addr, err)
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
