package app

import (
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/sweep"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// wireDomain builds the domain services into deps and registers their sweep
// tasks. Each feature adds its own lines here.
func wireDomain(deps *httpapi.Deps, sweeper *sweep.Sweeper) error {
	deps.Jobs = jobs.New(deps.Pool, deps.Sealer, deps.Config.KeyHashSecret, deps.Config.JobLeaseGraceMs, deps.Now)
	sweeper.Add(deps.Jobs.SweepTasks()...)

	deps.Webhooks = webhooks.New(deps.Pool, deps.Sealer, deps.Now, deps.Config.WebhookAllowPrivateNetworks)
	// Webhook tasks run last, so events recorded earlier in the same pass go out in it.
	sweeper.Add(
		sweep.Task{Name: "webhooks.dispatch", Run: deps.Webhooks.Dispatch},
		sweep.Task{Name: "webhooks.deliver", Run: deps.Webhooks.Deliver},
	)
	return nil
}
