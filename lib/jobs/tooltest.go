package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
)

// ToolTestRequest is the body of POST /api/v1/tools/{name}/test.
type ToolTestRequest struct {
	Version string          `json:"version" openapi:"minLength=1,maxLength=100,toolname"`
	Input   json.RawMessage `json:"input,omitempty"`
}

// ToolTestResult answers a synthetic test: the run made for it (synthetic,
// completion already requested, so it ends with its one step) and the step's
// job, which has exactly one attempt.
type ToolTestResult struct {
	RunID           string     `json:"runId"`
	StepID          string     `json:"stepId"`
	JobID           string     `json:"jobId"`
	Name            string     `json:"name"`
	Version         string     `json:"version"`
	ContractVersion *int64     `json:"contractVersion"`
	Status          string     `json:"status" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	MaxAttempts     int        `json:"maxAttempts"`
	DueAt           *time.Time `json:"dueAt"`
}

// TestTool enqueues a synthetic one-attempt job of name@version in a new
// synthetic run. Contract selection, input validation and output
// validation are those of a normal enqueue (the implicit contract of
// name@version); the attempt count is always 1 (seed 000). Like an
// enqueue, it queues nothing for a key revoked meanwhile (EnqueueAs).
func (s *Service) TestTool(ctx context.Context, p *auth.Principal, name string, req ToolTestRequest) (ToolTestResult, error) {
	workspaceID := p.WorkspaceID
	now := s.now()
	runID := ids.NewAt(ids.Run, now)
	one := int64(1)
	op, err := EnqueueRequest{Name: name, Version: req.Version, Input: req.Input, MaxAttempts: &one}.validate(runID)
	if err != nil {
		return ToolTestResult{}, err
	}
	out := ToolTestResult{RunID: runID, Name: name, Version: req.Version, MaxAttempts: 1}
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlInsertSyntheticRun, runID, workspaceID, "Synthetic test of "+name+"@"+req.Version,
			now); err != nil {
			return fmt.Errorf("synthetic run: %w", err)
		}
		res, err := s.enqueue(ctx, tx, workspaceID, &p.KeyID, op)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlRequestCompletion, runID, workspaceID); err != nil {
			return fmt.Errorf("synthetic run: %w", err)
		}
		out.StepID, out.JobID, out.Status, out.DueAt = res.StepID, res.JobID, res.Status, res.DueAt
		out.ContractVersion = res.contractVersion
		return nil
	})
	if err != nil {
		return ToolTestResult{}, err
	}
	if out.Status == StatusQueued {
		db.AfterCommit(ctx, func() { s.wake.wakeOne(workspaceID, toolKey(name, req.Version)) })
	}
	return out, nil
}
