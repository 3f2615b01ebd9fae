package app

import (
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/sweep"
)

// wireDomain builds the domain services into deps and registers their sweep
// tasks. Each feature adds its own lines here.
func wireDomain(deps *httpapi.Deps, sweeper *sweep.Sweeper) error {
	_ = deps
	_ = sweeper
	return nil
}
