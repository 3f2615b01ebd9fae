package httpapi

// gateRoutes are the effect gate's routes (API.md §2).
func (s *Server) gateRoutes() []Route { return nil }
