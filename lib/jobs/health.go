package jobs

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/toolname"
)

// workerSeenWindow is how recently a worker must have polled to count as
// serving its versions (workers poll every 30 s by default).
const workerSeenWindow = 2 * time.Minute

// QueueHealth is one exact name@version with queued work.
type QueueHealth struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Queued  int64  `json:"queued"`
	// Due is how many of them a claim could take now: the rest are
	// retries or delayed enqueues waiting for their time, and replayed
	// jobs waiting for their cancelled attempts (due at those attempts'
	// lease expiry, or at their reports if sooner).
	Due                    int64 `json:"due" jsonschema:"how many of the queued jobs a claim could take now, were nothing holding them; the rest are retries and delayed enqueues waiting for their time, and replayed jobs waiting for their cancelled attempt to report or its lease to expire"`
	OldestQueuedAgeSeconds int64 `json:"oldestQueuedAgeSeconds"`
	// WorkersSeen counts the workers serving this exact version that polled
	// in the last workerSeenWindow under a key not revoked since.
	WorkersSeen int64 `json:"workersSeen" jsonschema:"workers registered for this exact name@version that polled (or registered) in the last 2 minutes, under a key not revoked since (a revoked key's worker never claims again)"`
	// The endpoints of its queued jobs that hold them: circuit open, paused,
	// every concurrency slot taken (maxConcurrent) while a job needs a new
	// one (a lapsed job keeps its own), this minute's rateLimitPerMinute
	// used up. The last two hold jobs by design, and only due ones; they are
	// named because a queue that does not move looks the same.
	// Each is [] for none (sqlQueueHealth's coalesce).
	OpenCircuitEndpoints []string `json:"openCircuitEndpoints" openapi:"notNull"`
	PausedEndpoints      []string `json:"pausedEndpoints" openapi:"notNull"`
	AtLimitEndpoints     []string `json:"atConcurrencyLimitEndpoints" openapi:"notNull"`
	RateLimitedEndpoints []string `json:"rateLimitedEndpoints" openapi:"notNull"`
	// Message says plainly what holds the queue, when something does.
	Message *string `json:"message"`
	// heldReplayEndpoints are the endpoints where a replayed job waits for
	// its cancelled attempt, which may still run, to end (migration 0060;
	// the job is not due until then); said in Message only.
	heldReplayEndpoints []string
}

// HealthCursor is the cursor of the page that follows h.
func (h QueueHealth) HealthCursor() string { return h.Name + "@" + h.Version }

// ValidHealthCursor says whether cursor can be a queue health page's
// nextCursor (a row's HealthCursor).
func ValidHealthCursor(cursor string) bool {
	name, version, ok := strings.Cut(cursor, "@")
	return ok && toolname.Stored(name) && toolname.Stored(version)
}

// QueueHealth reports queued work per exact name@version and whether any
// worker serves it: limit rows in name, version order after cursor (a
// row's HealthCursor; "" for the first page).
func (s *Service) QueueHealth(ctx context.Context, workspaceID, cursor string, limit int) ([]QueueHealth, error) {
	after := []any{nil, nil}
	if cursor != "" {
		if !ValidHealthCursor(cursor) {
			return nil, apierr.InvalidField("cursor", "is not a cursor from this API")
		}
		name, version, _ := strings.Cut(cursor, "@")
		after = []any{name, version}
	}
	now := s.now()
	rows, err := s.pool.Query(ctx, sqlQueueHealth, workspaceID, now, now.Add(-workerSeenWindow), after[0], after[1], limit,
		now.Truncate(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("queue health: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueHealth, error) {
		var h QueueHealth
		var oldest *time.Time
		if err := r.Scan(&h.Name, &h.Version, &h.Queued, &h.Due, &oldest, &h.WorkersSeen, &h.OpenCircuitEndpoints,
			&h.PausedEndpoints, &h.AtLimitEndpoints, &h.RateLimitedEndpoints, &h.heldReplayEndpoints); err != nil {
			return h, err
		}
		if oldest != nil {
			h.OldestQueuedAgeSeconds = int64(now.Sub(*oldest).Seconds())
		}
		h.Message = h.explain()
		return h, nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue health: %w", err)
	}
	if out == nil {
		out = []QueueHealth{}
	}
	return out, nil
}

// explain says what holds h's queue, in seed 000's runbook order: no worker
// serving the exact version, an open circuit, a pause; then the limits that
// hold jobs by design, a concurrency limit reached and a rate used up (jobs
// QA: a queue held by its limit read null, as if nothing held it). nil when
// nothing does. With no job due yet (retries and delayed enqueues waiting for their
// time), a missing worker holds nothing yet and says so (QA: a retry a day
// out read as jobs waiting).
func (h QueueHealth) explain() *string {
	var parts []string
	if h.WorkersSeen == 0 {
		waiting := fmt.Sprintf("%d job(s) are due", h.Due)
		if h.Due == 0 {
			waiting = fmt.Sprintf("%d job(s) are queued, none due yet", h.Queued)
		}
		parts = append(parts, fmt.Sprintf("No worker serving %s@%s has polled in the last %d minutes under a key "+
			"that is not revoked; %s. Start a worker whose WORKER key lists %s@%s and that registers exactly "+
			"that version.",
			h.Name, h.Version, int(workerSeenWindow.Minutes()), waiting, h.Name, h.Version))
	}
	if len(h.OpenCircuitEndpoints) > 0 {
		parts = append(parts, endpointsSay(h.OpenCircuitEndpoints,
			"The circuit of endpoint %s is open: its jobs wait for one probe per cooldown. Inspect recent "+
				"attempts and the external service before closing it.",
			"The circuits of endpoints %s are open: their jobs wait for one probe per cooldown each. Inspect "+
				"recent attempts and the external services before closing them."))
	}
	if len(h.PausedEndpoints) > 0 {
		parts = append(parts, endpointsSay(h.PausedEndpoints,
			"Endpoint %s is paused: its jobs are held, consuming no attempts, until it is resumed.",
			"Endpoints %s are paused: their jobs are held, consuming no attempts, until they are resumed."))
	}
	if len(h.AtLimitEndpoints) > 0 {
		parts = append(parts, endpointsSay(h.AtLimitEndpoints,
			"Endpoint %s runs as many jobs as its maxConcurrent allows: the others wait for one to end "+
				"(raise the limit if the service can take more).",
			"Endpoints %s each run as many jobs as their maxConcurrent allows: the others wait for one to end "+
				"(raise the limits if the services can take more)."))
	}
	if len(h.RateLimitedEndpoints) > 0 {
		parts = append(parts, endpointsSay(h.RateLimitedEndpoints,
			"Endpoint %s has started its rateLimitPerMinute this minute: the others wait for the next minute.",
			"Endpoints %s have each started their rateLimitPerMinute this minute: the others wait for the "+
				"next minute."))
	}
	if len(h.heldReplayEndpoints) > 0 {
		parts = append(parts, endpointsSay(h.heldReplayEndpoints,
			"On endpoint %s, a replayed job waits for its cancelled attempt, which may still be running, "+
				"to report or its lease to expire.",
			"On endpoints %s, replayed jobs wait for their cancelled attempts, which may still be running, "+
				"to report or their leases to expire."))
	}
	if parts == nil {
		return nil
	}
	m := strings.Join(parts, " ")
	return &m
}

// endpointsSay fills one of two wordings with the endpoint names: one for a
// single endpoint, many for a list (QA: "Endpoint a, b runs … its
// maxConcurrent" read as one endpoint with a strange name).
func endpointsSay(names []string, one, many string) string {
	if len(names) == 1 {
		return fmt.Sprintf(one, names[0])
	}
	return fmt.Sprintf(many, strings.Join(names, ", "))
}
