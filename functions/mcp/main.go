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
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/getratchet/ratchet/lib/mcpserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	base := os.Getenv("RATCHET_BASE_URL")
	if base == "" {
		base = "http://localhost:8787"
	}
	key := os.Getenv("RATCHET_API_KEY")
	if key == "" {
		fmt.Fprintln(os.Stderr, "ratchet-mcp: RATCHET_API_KEY is required but not set")
		os.Exit(2)
	}
	caller := mcpserver.HTTPCaller{BaseURL: base, Client: &http.Client{Timeout: 60 * time.Second}}
	pipes := newDrainingPipes(os.Stdin, os.Stdout)
	transport := &mcp.IOTransport{Reader: pipes.Reader(), Writer: pipes.Writer()}
	if err := mcpserver.New(caller, "Bearer "+key).Run(ctx, transport); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "ratchet-mcp:", err)
		os.Exit(1)
	}
}
