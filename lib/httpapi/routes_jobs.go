package httpapi

// jobsRoutes are the durable-job routes (API.md §3).
func (s *Server) jobsRoutes() []Route { return nil }
