package app

import (
	"context"
	"time"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/sweep"
)

// lapsedLeasesPerPass bounds one sweeper pass over lapsed effect leases.
const lapsedLeasesPerPass = 500

// wireDomain builds the domain services into deps and registers their sweep
// tasks. Each feature adds its own lines here.
func wireDomain(deps *httpapi.Deps, sweeper *sweep.Sweeper) error {
	deps.Gate = gate.New(deps.Pool, deps.Sealer, deps.Auth.Hash, deps.Now)
	sweeper.Add(sweep.Task{
		Name: "effects.lapsed_leases",
		Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Gate.SweepLapsed(ctx, now, lapsedLeasesPerPass)
		},
	})
	return nil
}
