// Command mcp is Ratchet's MCP server over stdio, for MCP clients that launch
// a local process (Claude Desktop, Claude Code, Cursor). Each tool call is
// sent to a Ratchet server over HTTP:
//
//	RATCHET_BASE_URL  the server (default http://localhost:8787)
//	RATCHET_API_KEY   the key every call uses (an AGENT key is enough)
//
// Example client configuration:
//
//	{"mcpServers": {"ratchet": {"command": "ratchet-mcp",
//	  "env": {"RATCHET_BASE_URL": "https://…", "RATCHET_API_KEY": "rk_…"}}}}
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/getratchet/ratchet/lib/mcpserver"
	"github.com/getratchet/ratchet/lib/redact"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	base, key, err := settings(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratchet-mcp:", redact.ErrorText(err))
		os.Exit(2)
	}
	caller := mcpserver.HTTPCaller{BaseURL: base, Client: &http.Client{Timeout: 60 * time.Second}}
	pipes := newDrainingPipes(os.Stdin, os.Stdout)
	pipes.release = func(result json.RawMessage) { releaseUnseen(caller, "Bearer "+key, result) }
	transport := &mcp.IOTransport{Reader: pipes.Reader(), Writer: pipes.Writer()}
	err = mcpserver.New(caller, "Bearer "+key).Run(ctx, transport)
	// Interrupted before stdin ended: the leases of cancelled begins still
	// held for a retry are given back (at stdin's end the drain does it).
	pipes.giveBackHeld(mcpserver.CancelGrace)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "ratchet-mcp:", redact.ErrorText(err))
		os.Exit(1)
	}
}

// releaseUnseen gives back the lease a cancelled ratchet_begin was granted
// (mcpserver.ReleaseUnseen): its answer is not written, and no begin came
// to rejoin it (hold.go). Said on stderr, naming nothing of the call.
func releaseUnseen(c mcpserver.Caller, auth string, result json.RawMessage) {
	ctx, stop := mcpserver.GivingBack(context.Background(), mcpserver.CancelGrace)
	defer stop()
	switch released, err := mcpserver.ReleaseUnseen(ctx, c, auth, result); {
	case err != nil:
		fmt.Fprintf(os.Stderr, "ratchet-mcp: a cancelled ratchet_begin was granted a lease; giving it back failed (%v): "+
			"it lapses on its own\n", redact.ErrorText(err))
	case released:
		fmt.Fprintln(os.Stderr, "ratchet-mcp: a cancelled ratchet_begin was granted a lease; reported failed, "+
			"its key is free for a retry")
	}
}

// settings reads the server and the key from the environment. A key copied
// with its line's newline (a file read into the variable) is trimmed; one
// still holding what no key holds, and a server that is not an http(s) URL,
// are refused at start (QA: such a key made every call fail as an
// unreachable server whose outcome was unknown, though nothing was sent).
func settings(getenv func(string) string) (base, key string, err error) {
	base = strings.TrimSpace(getenv("RATCHET_BASE_URL"))
	if base == "" {
		base = "http://localhost:8787"
	}
	if u, perr := url.Parse(base); perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", errors.New("RATCHET_BASE_URL must be an http:// or https:// URL, e.g. http://localhost:8787")
	}
	key = strings.TrimSpace(getenv("RATCHET_API_KEY"))
	if key == "" {
		return "", "", errors.New("RATCHET_API_KEY is required but not set")
	}
	if strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return "", "", errors.New("RATCHET_API_KEY holds spaces or characters no key has (copy the key again)")
	}
	return base, key, nil
}
