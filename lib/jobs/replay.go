package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/toolname"
)

// Replay re-queues a step's ended durable job (the same job, its attempt
// history kept) after an operator acknowledged the duplicate risk, optionally
// upgrading it to another contract of the same tool (seed 000, "Replaying a
// failed step"; API.md §5).

// replayIDPrefix prefixes the ids of replay audit rows.
const replayIDPrefix = "rpl"

// maxReplayTargets bounds the preview's upgrades list (newest first).
const maxReplayTargets = 100

const maxReplayReason = 1000

// ReplayUpgrade is one contract a replay may target. compatible says the
// step's saved input validates against its inputSchema; validation says why
// not (field paths and rules, never values). checked says whether the
// input was checked against it at all: not when the preview's budget
// (fitBudget) ran out before it, nor when the input cannot be opened
// (inputUnreadable). Its fit is then unknown: compatible reads false, and
// a replay onto it checks it (clients could tell "does not fit" from "not
// checked" only by the validation's message).
type ReplayUpgrade struct {
	ContractVersion int                 `json:"contractVersion"`
	HandlerVersion  string              `json:"handlerVersion"`
	Status          string              `json:"status" openapi:"enum=ACTIVE|FORBIDDEN"`
	Compatible      bool                `json:"compatible"`
	Forbidden       bool                `json:"forbidden"`
	Checked         bool                `json:"checked" jsonschema:"true when the saved input was checked against this contract's inputSchema, so that compatible says whether it fits; false when it was not: the preview's check budget (one enqueue's, over all its targets: those not FORBIDDEN first, newest first, then the FORBIDDEN ones with what is left) ran out before it (compatible false, validation one entry, field input, saying so), or the input cannot be decrypted (inputUnreadable). Its fit is then unknown, eligible counts it as one that may take the step, and a replay onto it (targetContractVersion) checks it, 409 invalid_state when it does not fit"`
	Validation      []apierr.FieldError `json:"validation" openapi:"notNull"`
}

// fitBudget is what one replay preview may spend checking the saved input
// against its targets' input schemas: the evaluations one enqueue's check
// may take (MaxCheckEvaluations), over them all, those a replay may choose
// first (PreviewReplay). Each target was held to it
// alone, so a preview spent it up to once per target, 100 listed and any
// number older (QA: a 450 kB input checked against 3 contracts answered the
// preview after 27 s, 12 s past its deadline; 100 such contracts would hold
// a core for minutes per GET). A target it does not reach reads
// compatible false with a validation saying it was not checked; a replay
// onto it checks it (replayTarget), within an enqueue's budget.
type fitBudget struct{ left int64 }

func newFitBudget() *fitBudget { return &fitBudget{left: MaxCheckEvaluations} }

// notChecked is the validation of a target the preview's budget did not
// reach.
var notChecked = apierr.FieldError{Field: "input", Message: fmt.Sprintf("was not checked against this contract's "+
	"inputSchema: checking it, after the contracts checked before it (those not FORBIDDEN first, newest first), "+
	"could evaluate more than the %d subschemas a "+
	"preview checks in all; a replay onto it (targetContractVersion) checks it", MaxCheckEvaluations)}

// fit checks the saved input against schema from what is left of the
// budget: checked is false, with no problems, when what is left could not
// cover the check. Compiling the schema is counted too (compileEvaluations),
// whether or not the cache holds it, so that what a preview checks does
// not depend on what the cache holds: only evaluations were, and a preview
// compiled every target it listed and every older one it read on, each up
// to about 0.15 s (review).
func (b *fitBudget) fit(schema, input json.RawMessage) (problems []apierr.FieldError, checked bool, err error) {
	if schema == nil {
		// Not read: the budget left cannot reach it (sqlReplayTargets,
		// sqlReplayOlderTargets), nor anything after it.
		b.left = min(b.left, 0)
		return nil, false, nil
	}
	if b.left -= compileEvaluations(schema); b.left <= 0 {
		return nil, false, nil
	}
	problems, n, err := validateDocWithin(schema, input, "input", b.left)
	b.left -= n
	if errors.Is(err, errOverBudget) {
		return nil, false, nil
	}
	return problems, true, err
}

// replayTarget is a contract the preview lists (sqlReplayTargets): schema
// is its input schema, nil until read; cost bounds from below what
// compiling it spends of the budget, and bytes is its size as read.
type replayTarget struct {
	version                int
	handlerVersion, status string
	schema                 json.RawMessage
	cost, bytes            int64
}

// replaySchemaBatchBytes bounds the input schemas one read of the preview
// carries, past its first: about four of the largest a contract may have.
const replaySchemaBatchBytes = 1 << 20

// readReplaySchemas reads the schemas of the targets order lists (indexes
// into targets, in the order the budget is spent) that left may reach,
// from the first on, in one statement of at most replaySchemaBatchBytes
// of them (the first whatever its size).
func (s *Service) readReplaySchemas(ctx context.Context, workspaceID, name string, targets []replayTarget,
	order []int, left int64) error {
	var versions []int32
	var cost, size int64
	for _, i := range order {
		t := targets[i]
		if t.schema != nil {
			continue
		}
		cost += t.cost
		size += t.bytes
		if cost >= left || len(versions) > 0 && size > replaySchemaBatchBytes {
			break
		}
		versions = append(versions, int32(t.version))
	}
	rows, err := s.pool.Query(ctx, sqlReplaySchemas, workspaceID, name, versions)
	if err != nil {
		return fmt.Errorf("replay target schemas: %w", err)
	}
	read := map[int]json.RawMessage{}
	var version int
	var schema []byte
	if _, err := pgx.ForEachRow(rows, []any{&version, &schema}, func() error {
		read[version] = slices.Clone(schema)
		return nil
	}); err != nil {
		return fmt.Errorf("replay target schemas: %w", err)
	}
	for i := range targets {
		if sch, ok := read[targets[i].version]; ok {
			targets[i].schema = sch
		}
	}
	if s.onSchemasRead != nil {
		s.onSchemasRead(slices.Sorted(maps.Keys(read)))
	}
	return nil
}

// ReplayPreview answers GET /api/v1/steps/{id}/replay. handlerVersion is the
// step's current handler version: a version change sends it back as
// expectedHandlerVersion.
type ReplayPreview struct {
	StepID   string `json:"stepId"`
	JobID    string `json:"jobId"`
	Name     string `json:"name"`
	Status   string `json:"status" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	Eligible bool   `json:"eligible"`
	// IneligibleReason says why a replay would be refused now (the step's
	// status, or its dependency: agent QA, a CANCELLED step read
	// eligible: false with nothing saying why); null when eligible.
	IneligibleReason *string `json:"ineligibleReason"`
	HandlerVersion   string  `json:"handlerVersion"`
	// HandlerVersionForbidden says every contract of name@handlerVersion is
	// FORBIDDEN: a replay of the same version is refused (409), as its
	// enqueue is, and only an upgrade can run the step. eligible then says
	// whether one can: some upgrade neither FORBIDDEN nor known not to fit
	// (jobs QA: the preview read eligible for a step no replay could run).
	HandlerVersionForbidden bool            `json:"handlerVersionForbidden" jsonschema:"true when every contract of the step's tool at its handlerVersion is FORBIDDEN: a replay of the same version is then refused (409 invalid_state), as its enqueue is, and only a replay onto an upgrade that is not forbidden can run the step (eligible is false, with ineligibleReason, when no upgrade can); false otherwise"`
	ContractVersion         *int            `json:"contractVersion"`
	Attempt                 int             `json:"attempt"`
	MaxAttempts             int             `json:"maxAttempts"`
	EndpointPaused          bool            `json:"endpointPaused"`
	Upgrades                []ReplayUpgrade `json:"upgrades" openapi:"notNull"`
	// InputUnreadable says the step's saved input is sealed with a key this
	// instance lacks (RESULT_ENCRYPTION_KEY / RESULT_ENCRYPTION_KEYS), or
	// is damaged, so no upgrade can be shown to fit: each reads compatible
	// and checked false with no validation, and a replay, onto one or of the same
	// version, answers 500 (seal QA: the preview itself answered 500,
	// eligibility and all). eligible still says what the step's state and
	// dependency allow: the key, once configured again, allows the rest.
	InputUnreadable bool `json:"inputUnreadable" jsonschema:"true when the step's saved input cannot be decrypted by this server (sealed with an encryption key it is not configured with, or damaged): every upgrade then reads compatible false and checked false with an empty validation, as none can be checked, and a replay, of the same version or onto another contract, is refused with 500 and changes nothing until the key is configured again; false otherwise"`
}

// ReplayRequest is the body of POST /api/v1/steps/{id}/replay.
type ReplayRequest struct {
	AcknowledgeDuplicateRisk *bool   `json:"acknowledgeDuplicateRisk" openapi:"required"`
	MaxAttempts              *int64  `json:"maxAttempts,omitempty" openapi:"min=1,max=10"`
	Reason                   *string `json:"reason,omitempty" openapi:"maxLength=1000"`
	TargetContractVersion    *int64  `json:"targetContractVersion,omitempty" openapi:"min=1"`
	ExpectedHandlerVersion   *string `json:"expectedHandlerVersion,omitempty" openapi:"minLength=1,maxLength=100,toolname"` // toolname.ValidVersion
	AcknowledgeVersionChange *bool   `json:"acknowledgeVersionChange,omitempty"`
	// ExpectedAttempt is the step's attempt as the preview showed it: a
	// replay whose step has run since (the retry of a replay that landed,
	// its answer lost, whose attempt then ended) is refused instead of
	// running the job once more (retry-safety QA).
	ExpectedAttempt *int64 `json:"expectedAttempt,omitempty" openapi:"min=0"`
}

// ReplayResult answers a replay: the same job, QUEUED, with attempt the last
// attempt made so far and maxAttempts its lifetime ceiling.
type ReplayResult struct {
	StepID         string `json:"stepId"`
	JobID          string `json:"jobId"`
	Status         string `json:"status" openapi:"enum=QUEUED"`
	Attempt        int    `json:"attempt"`
	MaxAttempts    int    `json:"maxAttempts"`
	HandlerVersion string `json:"handlerVersion"`
}

// replayJob is the job row a replay decides on.
type replayJob struct {
	id, runID, name, version, status string
	contractVersion                  *int32
	attempt, maxAttempts, policyMax  int
	inputSealed                      []byte
	paused                           bool
	dependency                       *string // the afterStepId step's status
	afterStatus                      *string
	// versionForbidden: every contract of name@version is FORBIDDEN, so a
	// same-version replay is refused (an upgrade leaves the version).
	versionForbidden bool
	// synthetic: the step is a tool test's (POST /tools/{name}/test), whose
	// job has exactly one attempt (seed 000), so it is never replayed.
	synthetic bool
	// The job's lease, and its dependency's and whether that one is on its
	// last attempt (lapsedBy).
	leaseExpiresAt, dependencyLease *time.Time
	dependencyLast                  *bool
}

// lapsedBy says whether the job, or the step it depends on, is RUNNING on
// its last attempt with its lease lapsed by now: ended, as a read of the
// step would end it (readReplayJob).
func (j replayJob) lapsedBy(now time.Time) bool {
	own := DurableJob{Status: j.status, Attempt: j.attempt, MaxAttempts: j.maxAttempts, LeaseExpiresAt: j.leaseExpiresAt}
	return own.lapsedOnLastAttempt(now) || j.dependency != nil && *j.dependency == StatusRunning &&
		j.dependencyLast != nil && *j.dependencyLast && j.dependencyLease != nil && !j.dependencyLease.After(now)
}

func scanReplayJob(row pgx.Row) (replayJob, error) {
	var j replayJob
	err := row.Scan(&j.id, &j.runID, &j.name, &j.version, &j.contractVersion, &j.status, &j.attempt, &j.maxAttempts,
		&j.policyMax, &j.inputSealed, &j.paused, &j.dependency, &j.afterStatus, &j.versionForbidden, &j.synthetic,
		&j.leaseExpiresAt, &j.dependencyLast, &j.dependencyLease)
	return j, err
}

// replayable: only an ended-badly job is replayed, and only once the step
// it depends on ended the way it waits for (a step cancelled while WAITING
// would otherwise run before its dependency decided it, or after it decided
// that the step must never run).
// ineligible says why the step cannot be replayed now; "" when it can. The
// preview says it beside eligible, and a replay is refused with it.
func (j replayJob) ineligible() string {
	if j.synthetic {
		// "Synthetic tests always have one attempt" (seed 000): a replay
		// would give the test's job a second one, and reopen its run
		// (jobs QA: it was queued). Another test is its retry.
		return fmt.Sprintf("This step is a synthetic tool test, which has exactly one attempt; it is not replayed: "+
			"test the tool again (POST /api/v1/tools/%s/test).", j.name)
	}
	if j.status != StatusExhausted && j.status != StatusCancelled {
		return fmt.Sprintf("Only an EXHAUSTED or CANCELLED step can be replayed; this one is %s.", j.status)
	}
	return j.refusal()
}

// refusal says why the step's dependency forbids a replay; "" when it does
// not. The rule is the one an enqueue and a release apply: afterStatus
// SUCCEEDED runs after a success, FAILED after an exhausted dependency, and
// any other ending skips the step.
func (j replayJob) refusal() string {
	switch {
	case j.dependency == nil:
		return ""
	case !ended(*j.dependency):
		return "The step this one depends on (afterStepId) has not ended; replay after it."
	case j.afterStatus != nil && !afterStatusHolds(*j.afterStatus, *j.dependency):
		return fmt.Sprintf("The step this one depends on (afterStepId) ended %s, so afterStatus %s will never hold: "+
			"this step would be skipped, not run.", *j.dependency, *j.afterStatus)
	}
	return ""
}

// unskip puts the steps the replayed step's end skipped back to WAITING
// (sqlUnskipDependents), then those it put back's skipped dependents again
// until none is left: one statement sees its snapshot, and a step an
// enqueue added below one of them meanwhile (SKIPPED at once, its
// dependency being skipped) would stay skipped for good (review).
func unskip(ctx context.Context, tx pgx.Tx, stepID string, now time.Time) error {
	for frontier := []string{stepID}; len(frontier) > 0; {
		rows, err := tx.Query(ctx, sqlUnskipDependents, frontier, now)
		if err != nil {
			return fmt.Errorf("unskip dependents: %w", err)
		}
		if frontier, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return fmt.Errorf("unskip dependents: %w", err)
		}
	}
	return nil
}

// afterStatusHolds says whether a dependency that ended in status lets a
// step waiting for after run.
func afterStatusHolds(after, status string) bool {
	if after == StatusSucceeded {
		return status == StatusSucceeded
	}
	return status == StatusExhausted
}

// PreviewReplay says whether a step may be replayed and, for every other
// contract of its tool, whether the saved input fits it. The saved input is
// decrypted here and never returned.
func (s *Service) PreviewReplay(ctx context.Context, workspaceID, stepID string) (ReplayPreview, error) {
	j, err := s.readReplayJob(ctx, workspaceID, stepID)
	if err != nil {
		return ReplayPreview{}, err
	}
	input, openErr := s.open(j.id, "input", j.inputSealed)
	if openErr != nil {
		s.logger.Warn("a replay preview reads the step's input this instance cannot open as inputUnreadable",
			"job_id", j.id, "key_id", seal.KeyIDOf(j.inputSealed), "err", openErr)
	}
	budget := newFitBudget()
	if openErr != nil {
		budget.left = 0 // nothing is checked, so no schema is read
	}
	rows, err := s.pool.Query(ctx, sqlReplayTargets, workspaceID, j.name, maxReplayTargets, j.contractVersion,
		budget.left, compileBaseEvaluations, compileBytesPerEvaluation, replaySchemaBatchBytes)
	if err != nil {
		return ReplayPreview{}, fmt.Errorf("replay targets: %w", err)
	}
	targets, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (replayTarget, error) {
		var t replayTarget
		var schema []byte
		err := r.Scan(&t.version, &t.handlerVersion, &t.status, &schema, &t.cost, &t.bytes)
		t.schema = schema
		return t, err
	})
	if err != nil {
		return ReplayPreview{}, fmt.Errorf("replay targets: %w", err)
	}
	if s.onSchemasRead != nil {
		var read []int
		for _, t := range targets {
			if t.schema != nil {
				read = append(read, t.version)
			}
		}
		s.onSchemasRead(read)
	}
	out := ReplayPreview{StepID: stepID, JobID: j.id, Name: j.name, Status: j.status,
		HandlerVersion: j.version, ContractVersion: intPtr(j.contractVersion), Attempt: j.attempt,
		MaxAttempts: j.maxAttempts, EndpointPaused: j.paused, Upgrades: make([]ReplayUpgrade, len(targets)),
		InputUnreadable: openErr != nil, HandlerVersionForbidden: j.versionForbidden}
	var choosable, forbidden []int // indexes of targets, newest first
	for i, t := range targets {
		out.Upgrades[i] = ReplayUpgrade{ContractVersion: t.version, HandlerVersion: t.handlerVersion,
			Status: t.status, Forbidden: t.status == ContractForbidden, Validation: []apierr.FieldError{}}
		if out.Upgrades[i].Forbidden {
			forbidden = append(forbidden, i)
		} else {
			choosable = append(choosable, i)
		}
	}
	// The budget goes to the targets a replay may choose first (review: the
	// FORBIDDEN ones, never choosable, spent it in list order and could
	// leave every ACTIVE one below them not checked), then, when
	// eligibility needs them, to the older ones past the list, and what is
	// left to the FORBIDDEN ones, whose fit is only shown.
	check := func(order []int) error {
		for k, i := range order {
			if out.InputUnreadable {
				return nil
			}
			t, u := &targets[i], &out.Upgrades[i]
			if t.schema == nil && t.cost < budget.left {
				if err := s.readReplaySchemas(ctx, workspaceID, j.name, targets, order[k:], budget.left); err != nil {
					return err
				}
			}
			problems, checked, err := budget.fit(t.schema, input)
			switch {
			case err != nil:
				return err
			case !checked:
				u.Validation = []apierr.FieldError{notChecked}
			case problems != nil:
				u.Validation = problems
			}
			u.Checked, u.Compatible = checked, checked && len(problems) == 0
		}
		return nil
	}
	if err := check(choosable); err != nil {
		return ReplayPreview{}, err
	}
	why := j.ineligible()
	if why == "" && j.versionForbidden && !slices.ContainsFunc(out.Upgrades, func(u ReplayUpgrade) bool {
		// One whose fit cannot be told (inputUnreadable, or not checked
		// within the budget) may take the step (once the key is
		// configured again), as a same-version replay may (eligible says
		// what the step's state allows).
		return !u.Forbidden && (u.Compatible || !u.Checked)
	}) {
		runnable := false
		if len(targets) == maxReplayTargets {
			// The list is bounded; a replay onto an older contract is not
			// (jobs QA: a step whose only fitting upgrade was older than
			// the newest 100 read eligible: false).
			if runnable, err = s.olderUpgradeRuns(ctx, workspaceID, j, input, out.InputUnreadable,
				targets[len(targets)-1].version, budget); err != nil {
				return ReplayPreview{}, err
			}
		}
		if !runnable {
			why = ineligibleForbidden(j)
		}
	}
	if err := check(forbidden); err != nil {
		return ReplayPreview{}, err
	}
	out.Eligible = why == ""
	if why != "" {
		out.IneligibleReason = &why
	}
	if err := fitAnswer(ctx, &out); err != nil {
		return ReplayPreview{}, err
	}
	return out, nil
}

// fitAnswer keeps the preview within one answer (answer.Of): each
// upgrade's validation is cut to its first k problems, k the most, from
// maxValidationProblems down to 1, under which the answer fits (QA: 100
// contracts refusing an input's 20 keys of 1 000 control characters, each
// path escaped six times over, answered 12 MB, three times what the
// serverless platforms deliver, so the step could not be previewed). The
// upgrades and their compatible flags are kept whole; a path is at most
// apierr.MaxFieldBytes, so one problem each always fits the full budget.
func fitAnswer(ctx context.Context, out *ReplayPreview) error {
	full := make([][]apierr.FieldError, len(out.Upgrades))
	for i := range out.Upgrades {
		full[i], out.Upgrades[i].Validation = out.Upgrades[i].Validation, []apierr.FieldError{}
	}
	b, err := jsonx.Marshal(out)
	if err != nil {
		return fmt.Errorf("replay preview: %w", err)
	}
	// sizes[k-1] is what the answer grows by when each validation holds
	// its first k problems (each problem with its comma).
	sizes := make([]int, maxValidationProblems)
	for _, v := range full {
		for j, pr := range v[:min(len(v), maxValidationProblems)] {
			e, err := jsonx.Marshal(pr)
			if err != nil {
				return fmt.Errorf("replay preview: %w", err)
			}
			for k := j; k < maxValidationProblems; k++ {
				sizes[k] += len(e) + 1
			}
		}
	}
	k := maxValidationProblems
	for k > 1 && len(b)+sizes[k-1] > answer.Of(ctx) {
		k--
	}
	for i, v := range full {
		out.Upgrades[i].Validation = v[:min(len(v), k)]
	}
	return nil
}

// olderUpgradeRuns says whether a contract of the step's tool older than
// below, not FORBIDDEN, accepts the saved input (any does when the input
// cannot be opened: its fit is told once the key is configured again; and
// any the budget does not reach may), as a replay onto it would; read page
// by page, newest first, until one does. A page holds the schemas the
// budget left may reach, and no more (sqlReplayOlderTargets): one it
// cannot reach reads without its schema, and may take the step; when the
// input cannot be opened, the first does, read without its schema.
func (s *Service) olderUpgradeRuns(ctx context.Context, workspaceID string, j replayJob, input json.RawMessage,
	unreadable bool, below int, budget *fitBudget) (bool, error) {
	for {
		left := budget.left
		if unreadable {
			left = 0
		}
		rows, err := s.pool.Query(ctx, sqlReplayOlderTargets, workspaceID, j.name, below, maxReplayTargets, left,
			compileBaseEvaluations, compileBytesPerEvaluation)
		if err != nil {
			return false, fmt.Errorf("older replay targets: %w", err)
		}
		older, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Contract, error) { return scanContract(r) })
		if err != nil {
			return false, fmt.Errorf("older replay targets: %w", err)
		}
		if s.onOlderTargets != nil {
			s.onOlderTargets(older)
		}
		for _, c := range older {
			if c.InputSchema == nil {
				return true, nil // beyond the budget left: not checked
			}
			problems, checked, err := budget.fit(c.InputSchema, input)
			if err != nil {
				return false, err
			}
			if !checked || len(problems) == 0 {
				return true, nil
			}
		}
		if len(older) < maxReplayTargets {
			return false, nil
		}
		below = older[len(older)-1].ContractVersion
	}
}

// ineligibleForbidden says why a step of a wholly FORBIDDEN handler version
// that no upgrade can take cannot be replayed.
func ineligibleForbidden(j replayJob) string {
	return fmt.Sprintf("Every contract of %s@%s is FORBIDDEN, so a replay of the same version is refused, "+
		"and no other contract of the tool that is not FORBIDDEN accepts the saved input: publish an ACTIVE "+
		"contract it fits, then replay onto it (targetContractVersion).", j.name, j.version)
}

// readReplayJob reads the step's job without a lock. A job whose lease
// lapsed on its last attempt is ended first (as a read of the step does), so
// a dead job reads EXHAUSTED and is replayable at once; so is its
// dependency's (afterStepId, of the same run), whose end decides whether it
// may be replayed (jobs QA: a step cancelled while it waited read "has not
// ended" for a dependency any read of the run showed EXHAUSTED, and its
// replay was refused until a sweep).
func (s *Service) readReplayJob(ctx context.Context, workspaceID, stepID string) (replayJob, error) {
	for settled := false; ; settled = true {
		j, err := scanReplayJob(db.Conn(ctx, s.pool).QueryRow(ctx, sqlReplayPreview, stepID, workspaceID))
		if errors.Is(err, pgx.ErrNoRows) {
			return j, apierr.NotFound("step")
		}
		if err != nil {
			return j, fmt.Errorf("replay read: %w", err)
		}
		lapsible := j.status == StatusRunning && j.attempt >= j.maxAttempts
		if settled || !lapsible && (j.dependency == nil || *j.dependency != StatusRunning) {
			return j, nil
		}
		if n, err := s.exhaustLapsed(ctx, &j.runID, 1000); err != nil || n == 0 {
			return j, err
		}
	}
}

// validate checks the request on its own; whether it must acknowledge a
// version change depends on the step (versionChange).
func (req ReplayRequest) validate() (additional int, p apierr.Problems) {
	if req.AcknowledgeDuplicateRisk == nil || !*req.AcknowledgeDuplicateRisk {
		p.Add("acknowledgeDuplicateRisk", "must be true: the previous worker may have completed an external "+
			"side effect even though its result was not recorded")
	}
	additional = 1
	if m := req.MaxAttempts; m != nil {
		if *m < MinAttempts || *m > MaxAttemptsLimit {
			p.Add("maxAttempts", "%s", apierr.IntegerRule(MinAttempts, MaxAttemptsLimit))
		} else {
			additional = int(*m)
		}
	}
	if r := req.Reason; r != nil && utf8.RuneCountInString(*r) > maxReplayReason {
		p.Add("reason", "must be at most %d characters", maxReplayReason)
	}
	if a := req.ExpectedAttempt; a != nil && *a < 0 {
		// One beyond any attempt is refused as unreached, under the lock.
		p.Add("expectedAttempt", "%s", apierr.IntegerRule(0, typeMax))
	}
	if h := req.ExpectedHandlerVersion; h != nil && !toolname.ValidVersion(*h) {
		p.Add("expectedHandlerVersion", toolname.VersionRule)
	}
	if t := req.TargetContractVersion; t != nil {
		if *t < 1 {
			p.Add("targetContractVersion", "%s", apierr.IntegerRule(1, typeMax))
		}
	} else if req.AcknowledgeVersionChange != nil && *req.AcknowledgeVersionChange {
		// An acknowledged upgrade without its target would replay the old
		// version: the one the caller has just said it means to leave.
		p.Add("targetContractVersion", "is required with acknowledgeVersionChange (an upgrade's target, "+
			"from the preview's upgrades)")
	}
	return additional, p
}

// changesContract says the replay moves the step to another contract: a
// targetContractVersion other than the step's own. One equal to it is a
// same-version replay, which changes nothing to acknowledge.
func (req ReplayRequest) changesContract(j replayJob) bool {
	return req.TargetContractVersion != nil &&
		(j.contractVersion == nil || int64(*j.contractVersion) != *req.TargetContractVersion)
}

// versionChange adds what a replay onto another contract lacks: the
// step's handler version as the preview showed it, and the acknowledgement.
func (req ReplayRequest) versionChange(p *apierr.Problems) {
	if req.ExpectedHandlerVersion == nil {
		p.Add("expectedHandlerVersion", "is required with targetContractVersion (the preview's handlerVersion) "+
			"when it is another contract than the step's")
	}
	if req.AcknowledgeVersionChange == nil || !*req.AcknowledgeVersionChange {
		p.Add("acknowledgeVersionChange", "must be true to replay under another contract: review its schema "+
			"and side-effect changes first")
	}
}

// Replay re-queues the step's EXHAUSTED or CANCELLED job under its row lock.
// maxAttempts more executions are allowed (the lifetime ceiling becomes the
// attempts made so far plus maxAttempts). The same version keeps its retry
// policy snapshot; a target contract replaces the handler version, contract,
// timeout and complete retry policy (its attempt count capped at 10; the
// ceiling still decides exhaustion). A FAILED run whose only failed step
// this was goes back to RUNNING. A paused endpoint holds the job. A job
// cancelled while it ran whose attempt has neither reported nor seen its
// lease expire (jobs.slot_attempt) is QUEUED all the same, but no claim
// takes it until that attempt ends (migration 0060): the replay never runs
// beside it, and the duplicate risk acknowledged is a repeat after it. It
// is due at that attempt's lease expiry, or at its report if that comes
// first (replayDue). A saved input this instance cannot open refuses the
// replay, of the same version as onto a target, changing nothing.
func (s *Service) Replay(ctx context.Context, p *auth.Principal, stepID string, req ReplayRequest) (ReplayResult, error) {
	additional, problems := req.validate()
	if req.TargetContractVersion != nil {
		// A target that is the step's own contract changes nothing to
		// acknowledge (rechecked under the lock). Read without ending a
		// lapsed attempt: a refused request changes nothing. A step not
		// found is taken as on another contract, so that a request
		// refused for itself is refused whatever the step.
		j, err := scanReplayJob(db.Conn(db.OutsideRequest(ctx), s.pool).QueryRow(ctx, sqlReplayPreview, stepID,
			p.WorkspaceID))
		switch {
		case errors.Is(err, pgx.ErrNoRows) || err == nil && req.changesContract(j):
			req.versionChange(&problems)
		case err != nil:
			return ReplayResult{}, fmt.Errorf("replay read: %w", err)
		}
	}
	if err := problems.Err(); err != nil {
		return ReplayResult{}, err
	}
	// Ending a lapsed last attempt commits on its own, as a read of the
	// step would: under an Idempotency-Key it would otherwise hold the
	// run's shared and settle locks until the replay commits, and the
	// replay's run lock below would then come after them, against the
	// order reports and sweeps take them in (review: a deadlock). One that
	// lapsed while the replay waited for the job is ended so too, and the
	// replay looks again (QA: refused as RUNNING, a step any read then
	// showed EXHAUSTED).
	look := db.OutsideRequest(ctx)
	for round := 0; ; round++ {
		if _, err := s.readReplayJob(look, p.WorkspaceID, stepID); err != nil {
			return ReplayResult{}, err
		}
		out, err := s.replayLocked(ctx, p, stepID, req, additional, round < lapseLooks)
		if errors.Is(err, errLapsedMeanwhile) {
			look = db.AfterRequest(ctx) // see CancelStep
			continue
		}
		return out, err
	}
}

// replayLocked replays the step under its job's lock (see Replay).
// refuseLapsed: a job, or dependency, whose last attempt's lease has lapsed
// by then is errLapsedMeanwhile, to be ended first.
func (s *Service) replayLocked(ctx context.Context, p *auth.Principal, stepID string, req ReplayRequest, additional int,
	refuseLapsed bool) (ReplayResult, error) {
	var (
		out  ReplayResult
		tool string // the name@version the job is queued for (toolKey)
	)
	err := s.txRetrying(ctx, func(tx pgx.Tx) error {
		// A replay queues the job to run again: not for a key revoked on
		// another instance whose cache still holds it.
		if err := auth.RequireLive(ctx, tx, p.KeyID); err != nil {
			return err
		}
		j, err := scanReplayJob(tx.QueryRow(ctx, sqlReplayLock, stepID, p.WorkspaceID))
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("step")
		}
		if err != nil {
			return fmt.Errorf("replay lock: %w", err)
		}
		now := s.now()
		if refuseLapsed && j.lapsedBy(now) {
			return errLapsedMeanwhile
		}
		if why := j.ineligible(); why != "" {
			return apierr.InvalidState("%s", why)
		}
		if a := req.ExpectedAttempt; a != nil && *a < int64(j.attempt) {
			return apierr.InvalidState("The step has run since the attempt expected (%d): it is at attempt %d. "+
				"Re-read the preview; if this is the retry of a replay whose answer was lost, that replay landed.",
				*a, j.attempt).WithDetail("attempt", j.attempt)
		}
		if a := req.ExpectedAttempt; a != nil && *a > int64(j.attempt) {
			return apierr.InvalidState("The step has not reached the attempt expected (%d): it is at attempt %d. "+
				"expectedAttempt is the attempt the preview shows.", *a, j.attempt).WithDetail("attempt", j.attempt)
		}
		if h := req.ExpectedHandlerVersion; h != nil && *h != j.version {
			return apierr.Conflict(apierr.CodeVersionConflict,
				"expectedHandlerVersion is stale: the step's handler version is %s. Re-read the preview.", j.version).
				WithDetail("currentHandlerVersion", j.version)
		}
		ceiling := j.attempt + additional
		newVersion, newContract := j.version, intPtr(j.contractVersion)
		if upgrade := req.changesContract(j); upgrade {
			// The step's contract may have moved since the read above.
			var problems apierr.Problems
			if req.versionChange(&problems); problems != nil {
				return problems.Err()
			}
			c, err := s.replayTarget(ctx, tx, p.WorkspaceID, j, *req.TargetContractVersion)
			if err != nil {
				return err
			}
			newVersion, newContract = c.HandlerVersion, &c.ContractVersion
			pol := c.policy
			_, err = tx.Exec(ctx, sqlReplayUpgrade, j.id, ceiling, now, c.HandlerVersion, c.ContractVersion,
				c.TimeoutMs, pol.Preset, min(ceiling, MaxAttemptsLimit), pol.InitialDelayMs, pol.Multiplier,
				pol.MaxDelayMs, pol.JitterPercent)
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
		} else {
			if j.versionForbidden {
				// An enqueue of it is refused so (migration 0048): the
				// replay would run the handler version the operator
				// forbade (jobs QA: it was queued).
				return apierr.InvalidState("Every contract of %s@%s is FORBIDDEN, so a replay of the same "+
					"version is refused: replay it onto an ACTIVE contract (targetContractVersion, from the "+
					"preview's upgrades).", j.name, j.version)
			}
			// The same handler takes the saved input again, so it must open
			// (seal QA: a replay of an input sealed with a key this instance
			// lacks, or damaged, was queued; every claim then leased it, failed
			// to open it, rolled back and passed over it, logging so, while
			// the run read RUNNING, its skipped steps WAITING and step.replayed
			// went out for a job no instance could run). Refused as a replay
			// onto another contract is (replayTarget), changing nothing: a
			// missing key answers the 500 that says so, and the same request
			// succeeds once the key is configured again (at once through an
			// instance that has it, mid-deploy).
			if _, err := s.open(j.id, "input", j.inputSealed); err != nil {
				return fmt.Errorf("replay: open input of job %s: %w", j.id, err)
			}
			if _, err := tx.Exec(ctx, sqlReplaySameVersion, j.id, ceiling, now); err != nil {
				return fmt.Errorf("replay: %w", err)
			}
		}
		// The run's exclusive lock (after the job row, the order every
		// transaction ending a step follows) orders this with finish, with
		// reports settling the run and with replays of its other steps.
		if _, err := tx.Exec(ctx, sqlRunLockExclusive, j.runID); err != nil {
			return fmt.Errorf("lock run: %w", err)
		}
		// Job rows before the run's row, as an enqueue takes them (its
		// dependency's row, then the run's): an enqueue naming one of these
		// dependents would otherwise wait for the run while this waited
		// for it (review).
		if err := unskip(ctx, tx, stepID, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlReopenRun, j.runID, stepID); err != nil {
			return fmt.Errorf("reopen run: %w", err)
		}
		replayID := ids.NewAt(replayIDPrefix, now)
		if _, err := tx.Exec(ctx, sqlInsertReplay, replayID, p.WorkspaceID, j.id, stepID, p.KeyID, req.Reason,
			j.status, j.attempt, additional, ceiling, j.version, newVersion, intPtr(j.contractVersion), newContract,
			now); err != nil {
			return fmt.Errorf("replay audit: %w", err)
		}
		data, err := json.Marshal(map[string]any{"jobId": j.id, "runId": j.runID, "replayId": replayID, "keyId": p.KeyID,
			"priorStatus": j.status, "attempt": j.attempt, "maxAttempts": ceiling,
			"oldHandlerVersion": j.version, "newHandlerVersion": newVersion,
			"oldContractVersion": intPtr(j.contractVersion), "newContractVersion": newContract})
		if err != nil {
			return fmt.Errorf("replay event: %w", err)
		}
		if err := s.recordEvents(ctx, tx, []event{{workspaceID: p.WorkspaceID, typ: events.StepReplayed,
			subject: stepID, data: string(data), dedupe: replayID}}); err != nil {
			return err
		}
		out = ReplayResult{StepID: stepID, JobID: j.id, Status: StatusQueued, Attempt: j.attempt,
			MaxAttempts: ceiling, HandlerVersion: newVersion}
		tool = toolKey(j.name, newVersion)
		return nil
	})
	if err == nil {
		db.AfterCommit(ctx, func() { s.wake.wakeOne(p.WorkspaceID, tool) })
	}
	return out, err
}

// replayTarget reads and rechecks a replay's target contract under the job
// lock: it must exist for the tool, not be FORBIDDEN, and accept the saved
// input.
func (s *Service) replayTarget(ctx context.Context, q db.Querier, workspaceID string, j replayJob, version int64) (*Contract, error) {
	c, err := s.contractByVersion(ctx, q, workspaceID, j.name, version)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, apierr.InvalidField("targetContractVersion", noContractNumbered, j.name, version)
	}
	if c.Status == ContractForbidden {
		return nil, apierr.InvalidState("Contract %d of tool %s is FORBIDDEN; it cannot be a replay target.",
			c.ContractVersion, j.name)
	}
	input, err := s.open(j.id, "input", j.inputSealed)
	if err != nil {
		return nil, fmt.Errorf("replay: open input of job %s: %w", j.id, err)
	}
	problems, err := validateDoc(c.InputSchema, input, "input")
	if err != nil {
		return nil, err
	}
	if problems != nil {
		fields := make([]string, 0, len(problems))
		for _, pr := range problems {
			fields = append(fields, pr.Field)
		}
		return nil, apierr.InvalidState("The step's saved input does not validate against contract %d's inputSchema (%s).",
			c.ContractVersion, strings.Join(fields, ", ")).WithDetail("validation", problems)
	}
	return c, nil
}
