package app

import (
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/sweep"
)

// wireDomain builds the domain services into deps and registers their sweep
// tasks. Each feature adds its own lines here.
func wireDomain(deps *httpapi.Deps, sweeper *sweep.Sweeper) error {
	deps.Jobs = jobs.New(deps.Pool, deps.Sealer, deps.Config.KeyHashSecret, deps.Config.JobLeaseGraceMs, deps.Now)
	sweeper.Add(deps.Jobs.SweepTasks()...)
	return nil
}
