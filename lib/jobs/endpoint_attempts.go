package jobs

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/ids"
)

// EndpointAttempt is one attempt (one claim) of a job of an endpoint, with
// the job it belongs to: what an operator reads when the endpoint fails
// ("inspect recent attempts and the external service before resuming
// traffic").
type EndpointAttempt struct {
	JobID  string `json:"jobId"`
	StepID string `json:"stepId"`
	RunID  string `json:"runId"`
	Name   string `json:"name"`
	// Version is the handler version the attempt was claimed for, which a
	// replay onto another version leaves as it was.
	Version string `json:"version" jsonschema:"the handler version this attempt was claimed for (a later replay onto another version does not change it)"`
	AttemptFields
}

// AttemptFields is Attempt under another name, so that embedding it names
// no field Attempt: that would hide the attempt number (Attempt.Attempt)
// from the schema inference behind the OpenAPI document, which goes by Go
// names where encoding/json goes by JSON ones.
type AttemptFields = Attempt

// AttemptsCursor is where a page of an endpoint's attempts ends: its last
// attempt's start, job and number.
func AttemptsCursor(a EndpointAttempt) string {
	return strconv.FormatInt(a.StartedAt.UnixMicro(), 10) + ":" + a.JobID + ":" + strconv.Itoa(a.AttemptFields.Attempt)
}

// attemptsAfter is a parsed AttemptsCursor.
type attemptsAfter struct {
	started *time.Time // nil: the first page
	jobID   string
	attempt int
}

// ValidEndpointAttemptsCursor says whether cursor can be an endpoint
// attempts page's nextCursor (AttemptsCursor; "" for the first page).
func ValidEndpointAttemptsCursor(cursor string) bool {
	_, err := parseAttemptsCursor(cursor)
	return err == nil
}

func parseAttemptsCursor(cursor string) (attemptsAfter, error) {
	if cursor == "" {
		return attemptsAfter{}, nil
	}
	bad := apierr.InvalidField("cursor", "is not a cursor from this API")
	parts := strings.Split(cursor, ":")
	if len(parts) != 3 || !ids.Valid(ids.Job, parts[1]) {
		return attemptsAfter{}, bad
	}
	micros, ok := cursorNumber(parts[0], 0, math.MaxInt64)
	if !ok {
		return attemptsAfter{}, bad
	}
	attempt, ok := cursorNumber(parts[2], 1, math.MaxInt32) // the column's integer
	if !ok {
		return attemptsAfter{}, bad
	}
	started := time.UnixMicro(micros).UTC()
	return attemptsAfter{started: &started, jobID: parts[1], attempt: int(attempt)}, nil
}

// ListEndpointAttempts pages endpoint id's attempts newest first (by start,
// then job and attempt), only those of outcome when it is set (SUCCEEDED or
// FAILED; an attempt still running, or lapsed and not yet marked, has
// none). cursor is the previous page's AttemptsCursor.
//
// The outcome filter reads the endpoint's attempts newest first and keeps
// those it names: no index holds outcomes, since one would make every
// report's update of its attempt write all the table's indexes (not HOT),
// so on a busy endpoint whose failures are rare a FAILED page may read far.
func (s *Service) ListEndpointAttempts(ctx context.Context, workspaceID, id, outcome, cursor string,
	limit int) ([]EndpointAttempt, error) {
	if outcome != "" && outcome != StatusSucceeded && outcome != OutcomeFailed {
		return nil, apierr.InvalidField("outcome", "must be SUCCEEDED or FAILED")
	}
	after, err := parseAttemptsCursor(cursor)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, sqlEndpointAttempts, workspaceID, id, after.started, after.jobID, after.attempt,
		outcome, limit)
	if err != nil {
		return nil, fmt.Errorf("endpoint attempts: %w", err)
	}
	var unreadable unreadableMessages
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (EndpointAttempt, error) {
		var (
			a    EndpointAttempt
			read attemptRow
		)
		if err := row.Scan(read.dest(&a.JobID, &a.AttemptFields, &a.StepID, &a.RunID, &a.Name, &a.Version)...); err != nil {
			return a, err
		}
		s.openAttempt(a.JobID, &a.AttemptFields, read, &unreadable) // before a is returned: it sets the message
		return a, nil
	})
	if err != nil {
		return nil, fmt.Errorf("endpoint attempts: %w", err)
	}
	unreadable.log(s.logger)
	if len(out) > 0 {
		return out, nil
	}
	// An empty page: the endpoint's, or no endpoint of the workspace.
	var exists bool
	if err := s.pool.QueryRow(ctx, sqlEndpointExists, workspaceID, id).Scan(&exists); err != nil {
		return nil, fmt.Errorf("endpoint attempts: %w", err)
	}
	if !exists {
		return nil, apierr.NotFound("endpoint")
	}
	return []EndpointAttempt{}, nil
}
