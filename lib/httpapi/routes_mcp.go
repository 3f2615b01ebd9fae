package httpapi

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/getratchet/ratchet/lib/apierr"
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
		if r.Method != http.MethodPost {
			// Stateless with JSON responses: there is no event stream to
			// open (GET) and no session to end (DELETE). The transport
			// answers both 405, which MCP clients read as "not offered";
			// this says so in the API's envelope.
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, apierr.Of(apierr.CodeMethodNotAllowed,
				"This MCP endpoint is stateless: send each JSON-RPC message with POST."))
			return
		}
		s.mcp.once.Do(func() {
			s.mcp.handler = mcpserver.Handler(mcpserver.New(mcpserver.HandlerCaller{Handler: s}, ""))
		})
		s.mcp.handler.ServeHTTP(w, r)
	})
	summary := "MCP (streamable HTTP, stateless, JSON responses): the effect gate's nine tools. " +
		"Send the API key as Authorization: Bearer on each request (any valid key opens the endpoint; " +
		"each tool call is the REST call it names, with that call's scopes). GET and DELETE answer 405."
	var routes []Route
	for _, m := range []string{"POST", "GET", "DELETE"} {
		rt := Route{
			Method: m, Pattern: "/api/v1/mcp", Name: "mcp." + strings.ToLower(m),
			Tag: "mcp", Summary: summary, Status: 200, Timeout: 30 * time.Second, Raw: serve,
		}
		if m != http.MethodPost {
			rt.Status, rt.Errors = http.StatusMethodNotAllowed, []string{apierr.CodeMethodNotAllowed}
		}
		routes = append(routes, rt)
	}
	return routes
}
