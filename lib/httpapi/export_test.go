package httpapi

import (
	"net/http"
	"time"
)

// NewWithExtraRoutes builds a server whose table also holds extra routes, so
// tests can exercise the platform (panics, errors) without a real feature.
func NewWithExtraRoutes(d Deps, extra []Route) *Server {
	return newWithRoutes(d, func(s *Server) []Route { return append(s.routes(), extra...) })
}

// WrapMCPHandler has the MCP endpoint serve through wrap(transport), so
// that a test can decide a race the transport would (what it sees of a
// request). Call it before the endpoint's first request.
func (s *Server) WrapMCPHandler(wrap func(http.Handler) http.Handler) {
	s.mcp.once.Do(func() { s.mcp.handler = wrap(s.mcpHandler()) })
}

// NewWithMCPTimeout builds a server whose MCP endpoint's routes declare
// timeout in place of theirs, so that a test need not wait out 28 s.
func NewWithMCPTimeout(d Deps, timeout time.Duration) *Server {
	return newWithRoutes(d, func(s *Server) []Route {
		routes := s.routes()
		for i := range routes {
			if routes[i].Tag == "mcp" {
				routes[i].Timeout = timeout
			}
		}
		return routes
	})
}
