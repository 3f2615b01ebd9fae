package httpapi

import "github.com/getratchet/ratchet/lib/auth"

// signupSeeders prepare a new workspace inside the signup transaction.
func (s *Server) signupSeeders() []auth.Seeder {
	var seeders []auth.Seeder
	if s.Gate != nil {
		seeders = append(seeders, s.Gate.SeedStarterPolicies)
	}
	return seeders
}
