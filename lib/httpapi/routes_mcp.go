package httpapi

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/getratchet/ratchet/lib/mcpserver"
)

// mcpEndpoint lazily builds the MCP handler over this server's own router, so
// every tool call goes through the same authentication, scopes and
// validation as the REST call it mirrors.
type mcpEndpoint struct {
	once    sync.Once
	handler http.Handler
}

func (s *Server) mcpRoutes() []Route {
	serve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mcp.once.Do(func() {
			s.mcp.handler = mcpserver.Handler(mcpserver.New(mcpserver.HandlerCaller{Handler: s}, ""))
		})
		s.mcp.handler.ServeHTTP(w, r)
	})
	summary := "MCP (streamable HTTP, stateless, JSON responses): the effect gate's nine tools. " +
		"Send the API key as Authorization: Bearer on each request; every tool call is the REST call it names."
	var routes []Route
	for _, m := range []string{"POST", "GET", "DELETE"} {
		routes = append(routes, Route{
			Method: m, Pattern: "/api/v1/mcp", Name: "mcp." + strings.ToLower(m),
			Tag: "mcp", Auth: AuthNone, Summary: summary, Status: 200, Timeout: 30 * time.Second, Raw: serve,
		})
	}
	return routes
}
