package httpapi

// routes is the one route table. Every feature keeps its routes in its own
// routes_<feature>.go; this list only concatenates them.
func (s *Server) routes() []Route {
	var all []Route
	for _, part := range [][]Route{
		s.coreRoutes(),
		s.gateRoutes(),
		s.jobsRoutes(),
		s.webhookRoutes(),
		s.groupRoutes(),
		s.reconcileRoutes(),
		s.mcpRoutes(),
		s.contractsRoutes(),
		s.circuitRoutes(),
	} {
		all = append(all, part...)
	}
	return all
}
