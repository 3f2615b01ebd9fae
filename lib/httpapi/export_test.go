package httpapi

// NewWithExtraRoutes builds a server whose table also holds extra routes, so
// tests can exercise the platform (panics, errors) without a real feature.
func NewWithExtraRoutes(d Deps, extra []Route) *Server {
	return newWithRoutes(d, func(s *Server) []Route { return append(s.routes(), extra...) })
}
