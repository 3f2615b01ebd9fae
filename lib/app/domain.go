package app

import (
	"context"
	"time"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/sweep"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// lapsedLeasesPerPass bounds one batch of effects.lapsed_leases (a var:
// tests make a backlog of it with a few effects).
var lapsedLeasesPerPass = 500

// Bounds on one sweeper pass of each task.
const (
	groupsPerPass        = 100
	remindersPerPass     = 500
	mootApprovalsPerPass = 500
	circuitsPerPass      = 500
	spendCountersPerPass = 1000
	retentionPerPass     = 1000
	// typesToDatePerPass and groupsToDatePerPass bound the groups a pass
	// dates again for retentions lowered (groups.retention_lowered).
	typesToDatePerPass  = 100
	groupsToDatePerPass = 100
	// idempotentAnswersPerPass bounds the deletion of day-old answers
	// (lib/idempotency): creates are rare next to begins.
	idempotentAnswersPerPass = 1000
	// rateCountersPerPass bounds the deletion of ended rate-limit windows
	// (lib/auth): a rate-limited key in use makes one a minute, so a pass a
	// minute (the Vercel cron) keeps up with this many such keys, five
	// times over.
	rateCountersPerPass = 50_000
	// remindersEvery is the least time between two runs of
	// reconciliation.due in the local loop (sweep.Task.Every).
	remindersEvery = time.Minute
)

// secretShownBy names the resource whose secret an answer kept for an
// Idempotency-Key shows: a key's create, a webhook's create or rotation.
var secretShownBy = idempotency.SecretShownBy(auth.SecretKind, webhooks.SecretKind)

// wireDomain builds the domain services into deps and registers their sweep
// tasks. Each feature adds its own lines here.
func wireDomain(deps *httpapi.Deps, sweeper *sweep.Sweeper) error {
	deps.Gate = gate.New(deps.Pool, deps.Sealer, deps.Auth.Hash, deps.Now, deps.Logger)
	// Drains: a backlog of lapsed leases (a fleet of agents that died at
	// once) is made durable, each with its effect.indeterminate, batch
	// after batch while a cron pass has time, not a batch a minute
	// (multi-tenant QA: 100,000 lapses took 200 passes), until a batch is
	// short (leases lapsing meanwhile wait for the next pass).
	sweeper.Add(sweep.Task{
		Name: "effects.lapsed_leases", Drains: true, Batch: func() int { return lapsedLeasesPerPass },
		Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Gate.SweepLapsed(ctx, now, lapsedLeasesPerPass)
		},
	})

	sweeper.Add(
		sweep.Task{Name: "groups.settle", Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Gate.SweepGroups(ctx, now, groupsPerPass)
		}},
		// Once a minute in the local loop, as the cron passes: a pass reads
		// every type with reminders on, whose periods are whole hours.
		sweep.Task{Name: "reconciliation.due", Every: remindersEvery,
			Run: func(ctx context.Context, now time.Time) (int, error) {
				return deps.Gate.SweepReconcileDue(ctx, now, remindersPerPass)
			}},
		// Pending approvals that ask nothing any more, closed as a
		// resolution (effect settled succeeded) or a group's rollback
		// (effect kept from ever running) closes them: those left pending
		// before they did (session 61, and rollbacks before this), and
		// those one passed over while they were held. Before retention,
		// which keeps an effect whose approval is pending.
		sweep.Task{Name: "approvals.moot", Drains: true, Batch: func() int { return mootApprovalsPerPass },
			Run: func(ctx context.Context, now time.Time) (int, error) {
				return deps.Gate.SweepMootApprovals(ctx, now, mootApprovalsPerPass)
			}},
		sweep.Task{Name: "circuits.cooled_down", Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Gate.SweepCircuits(ctx, now, circuitsPerPass)
		}},
		// Drains, as the other deletions do: a backlog of counters of
		// days past (a day's counters of every workspace and scope) goes
		// batch after batch while a cron pass has time (scale QA: 72,000
		// took 72 passes), until a batch is short.
		sweep.Task{Name: "gate.spend_counters", Drains: true, Batch: func() int { return spendCountersPerPass },
			Run: func(ctx context.Context, now time.Time) (int, error) {
				return deps.Gate.SweepSpend(ctx, now, spendCountersPerPass)
			}},
		// Before retention, so that groups a lowered retention made due
		// go in the same pass.
		sweep.Task{Name: "groups.retention_lowered", Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Gate.SweepGroupsToDate(ctx, now, typesToDatePerPass, groupsToDatePerPass)
		}},
		sweep.Task{Name: "effects.retention", Drains: true, Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Gate.SweepRetention(ctx, now, retentionPerPass)
		}},
	)

	deps.Jobs = jobs.New(deps.Pool, deps.Sealer, deps.Config.KeyHashSecret, deps.Config.JobLeaseGraceMs, deps.Now, deps.Logger)
	sweeper.Add(deps.Jobs.SweepTasks()...)
	if days := deps.Config.JobRetentionDays; days > 0 {
		sweeper.Add(sweep.Task{Name: "jobs.retention", Drains: true, Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Jobs.PurgeRetired(ctx, now.AddDate(0, 0, -days), retentionPerPass)
		}})
	}

	deps.Webhooks = webhooks.New(deps.Pool, deps.Sealer, deps.Now, deps.Config.WebhookAllowPrivateNetworks, deps.Logger)
	// Webhook tasks run last, so events recorded earlier in the same pass go
	// out in it. Sending waits on receivers, so the local loop runs it
	// detached (sweep.Task.Detached).
	sweeper.Add(
		sweep.Task{Name: "webhooks.dispatch", Run: deps.Webhooks.Dispatch, Drains: true, Batch: deps.Webhooks.DispatchBatch},
		sweep.Task{Name: "webhooks.deliver", Run: deps.Webhooks.Deliver, Detached: true, Needs: webhooks.RoundTime},
		// The answers kept before migration 0067 are linked to the
		// subscriptions and keys whose secrets they show first, so that the
		// tasks after it erase, in the same pass, those of deleted
		// subscriptions and revoked keys.
		sweep.Task{Name: "idempotency.link_secrets", Drains: true,
			Batch: func() int { return idempotentAnswersPerPass },
			Run: func(ctx context.Context, _ time.Time) (int, error) {
				return deps.Idempotency.LinkAnswers(ctx, idempotentAnswersPerPass, secretShownBy)
			}},
		sweep.Task{Name: "webhooks.expired_secrets", Run: func(ctx context.Context, now time.Time) (int, error) {
			return deps.Webhooks.ClearExpiredSecrets(ctx, now, retentionPerPass)
		}},
		sweep.Task{Name: "keys.revoked_secrets", Run: func(ctx context.Context, _ time.Time) (int, error) {
			return deps.Auth.EraseRevokedAnswers(ctx, idempotentAnswersPerPass)
		}},
	)
	if days := deps.Config.EventRetentionDays; days > 0 {
		// Deliveries held longer than the events are kept end first, so
		// that the purge after it takes them with their events
		// (ExpireHeld). Two tasks, not one: a pass runs every task
		// whatever the one before it answered, so a failing expiry
		// (a statement timeout over a large held backlog) never stops
		// the purge of everything else (review).
		sweeper.Add(
			sweep.Task{Name: "webhooks.expire_held", Drains: true, Run: func(ctx context.Context, now time.Time) (int, error) {
				return deps.Webhooks.ExpireHeld(ctx, now.AddDate(0, 0, -days), retentionPerPass)
			}},
			sweep.Task{Name: "events.retention", Drains: true, Run: func(ctx context.Context, now time.Time) (int, error) {
				return deps.Webhooks.PurgeDelivered(ctx, now.AddDate(0, 0, -days), retentionPerPass)
			}},
		)
	}
	return nil
}
