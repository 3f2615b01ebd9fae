package jobs

import (
	"context"
	"time"

	"github.com/getratchet/ratchet/lib/toolname"
)

// SetPolling sets a service's long-poll pacing, so a test can make the
// poll pause longer than a claim's wait: the claim then looks again only
// when woken or when its wait runs out (see parkClaim).
func SetPolling(s *Service, pause time.Duration) { s.pollMin, s.pollMax = pause, pause }

// SetMaxWaitingClaims bounds the long polls one key may have waiting.
func SetMaxWaitingClaims(s *Service, n int) { s.waits = newWaitSlots(n) }

// SetPurgeSteps bounds the steps one retention pass deletes.
func SetPurgeSteps(s *Service, n int) { s.purgeSteps = n }

// SetSweepBatch bounds each sweeper task's work per pass.
func SetSweepBatch(s *Service, n int) { s.sweepBatch = n }

// SetClaimInputBudget bounds the sealed input one claim answers.
func SetClaimInputBudget(s *Service, bytes int64) { s.claimInputBudget = bytes }

// SettleRuns runs the sweeper's run-settling backstop once.
func SettleRuns(s *Service, limit int) (int, error) { return s.settleRuns(context.Background(), limit) }

// ReleaseStranded runs the sweeper's stranded-dependents backstop once.
func ReleaseStranded(s *Service, limit int) (int, error) {
	return s.releaseStranded(context.Background(), limit)
}

// LapseWait is how long a read waits for a held lapsed job.
const LapseWait = lapseWait

// SetDeadlockRetry turns the retry of a deadlock's victim on or off, so
// that a test can see whether a deadlock happens at all.
func SetDeadlockRetry(s *Service, on bool) { s.noDeadlockRetry = !on }

// SQLLockRetiredJobs is PurgeRetired's statement that locks the candidate
// runs' jobs, for a test of its plan.
const SQLLockRetiredJobs = sqlLockRetiredJobs

// OnLook tells f of every look a claim makes, once the look's statement
// has run. Set it before the service's first claim.
func OnLook(s *Service, f func(workerID string)) { s.looked = f }

// OnOlderTargets tells f of each page of older contracts a replay preview
// reads past its list. Set it before the service's first preview.
func OnOlderTargets(s *Service, f func([]Contract)) { s.onOlderTargets = f }

// OnSchemasRead tells f of the contracts each read of a replay preview's
// listed targets carried the input schemas of. Set it before the
// service's first preview.
func OnSchemasRead(s *Service, f func(versions []int)) { s.onSchemasRead = f }

// ReplaySchemaBatchBytes bounds the schemas one read of a preview's
// listed targets carries past its first.
const ReplaySchemaBatchBytes = replaySchemaBatchBytes

// The bounds the worker protocol's handlers check, for the test that their
// openapi tags restate them.
const (
	MaxTools        = toolname.MaxPairs
	MaxBatchReports = maxBatchReports
	MaxErrorMessage = maxErrorMessage
)

// MaxReplayTargets bounds the replay preview's upgrades list.
const MaxReplayTargets = maxReplayTargets

// MaxReplayReason is the longest replay reason, in characters.
const MaxReplayReason = maxReplayReason

// OutputRejection is the reason a report's output is rejected for.
func OutputRejection(outputSchema []byte, contractVersion int, output []byte) (string, error) {
	return outputRejection(outputSchema, contractVersion, output)
}

// CutMessage is cutMessage.
func CutMessage(msg string, n int) string { return cutMessage(msg, n) }

// SQLLapsedGatesFair and SQLRequeueGates are the sweeper's picks of lapsed
// last attempts and of lapsed leases to requeue, for a test of their plans.
var (
	SQLLapsedGatesFair = sqlLapsedGatesFair
	SQLRequeueGates    = sqlRequeueGates
)

// SQLQueueHealth is GET /queue/health's statement, for a test of its plan.
var SQLQueueHealth = sqlQueueHealth

// SQLListRuns is GET /runs's statement before db.NewestFirst pages it.
var SQLListRuns = sqlListRuns

// SetJitter fixes the uniform value retry jitter draws (in [0,1)), so that
// a test can predict a retry's due time.
func SetJitter(s *Service, u float64) { s.jitter = func() float64 { return u } }

// SQLRetiredRuns and SQLDeleteRuns are PurgeRetired's first and last
// statements, so a test can hold a pass open in a transaction of its own.
const (
	SQLRetiredRuns = sqlRetiredRuns
	SQLDeleteRuns  = sqlDeleteRuns
)

// SQLDeleteIdleWorkers is PurgeRetired's delete of idle workers, for a
// test of its plan.
const SQLDeleteIdleWorkers = sqlDeleteIdleWorkers

// SQLReplayTargets and SQLReplayOlderTargets are the replay preview's reads
// of its targets, for a test of what they read.
var (
	SQLReplayTargets      = sqlReplayTargets
	SQLReplayOlderTargets = sqlReplayOlderTargets
)

// CompileBaseEvaluations and CompileBytesPerEvaluation are what
// SQLReplayOlderTargets counts a schema's compiling as ($6 and $7).
const (
	CompileBaseEvaluations    = compileBaseEvaluations
	CompileBytesPerEvaluation = compileBytesPerEvaluation
)
