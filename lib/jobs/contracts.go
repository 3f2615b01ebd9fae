package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/toolname"
)

// Contract statuses. A FORBIDDEN contract cannot be selected explicitly at
// enqueue nor chosen as a replay target; implicit selection skips it for
// the latest ACTIVE contract of name@version, and selects it, to refuse
// the enqueue, when name@version has contracts and none ACTIVE (0048).
const (
	ContractActive    = "ACTIVE"
	ContractForbidden = "FORBIDDEN"
)

// maxSchemaBytes bounds one published schema.
const maxSchemaBytes = 256 << 10

// MaxSchemaDepth bounds how deeply a published schema nests objects and
// arrays. Compiling a schema, and checking a value against it, cost more
// than linearly in its depth, and the compiler heeds no deadline (QA: a
// chain of 2 000 "not" or "properties" levels, 10-40 kB, took 6-40 s of
// CPU, long after the request's deadline had answered 503). Real contracts
// nest a few dozen levels at most: 20 levels of objects, each
// {"properties": {"name": …}}, are 40.
const MaxSchemaDepth = 100

// MaxSchemaParts bounds how many objects and booleans (the values that can
// be subschemas) a published schema holds: the compiler's time grows with
// the square of their number (QA: {"allOf": [{} × 32 000]}, 96 kB, took 6 s,
// 48 000 answered 503 after 23 s); 5 000 compile in about 0.1 s.
const MaxSchemaParts = 5000

// MaxSchemaEvaluations bounds how many subschemas checking one value
// against a published schema may evaluate (evaluationsPerValue): a schema
// whose $refs reach the same parts again and again is refused at
// publication rather than at every enqueue.
const MaxSchemaEvaluations = 20_000

// MaxCheckEvaluations bounds how many subschemas checking one input or
// output against a contract's schema may evaluate (checkEvaluations): about
// 3.6 s where every one fails (2.4 µs each, an anyOf none of whose branches
// matches), well inside a request's 15 s. A 430 kB array of 10 000 objects,
// each checked against a oneOf of 20 four-property variants, evaluates
// about 1 million (0.6 s); 100 000 two-property objects (1.6 MB, more than
// a request may carry), 300 000. A keyword whose work grows with what it
// lists or the value it reads (an enum, a pattern on a long string)
// counts that work in evaluations (keywordWork).
const MaxCheckEvaluations = 1_500_000

// Contract is a published, immutable version of a tool's contract (API.md §5).
type Contract struct {
	Name            string          `json:"name"`
	ContractVersion int             `json:"contractVersion"`
	HandlerVersion  string          `json:"handlerVersion"`
	InputSchema     json.RawMessage `json:"inputSchema"`
	OutputSchema    json.RawMessage `json:"outputSchema"`
	TimeoutMs       int64           `json:"timeoutMs"`
	RetryPreset     string          `json:"retryPreset" openapi:"enum=STANDARD|AGGRESSIVE|RELAXED|CUSTOM"`
	RetryPolicy     *RetryPolicy    `json:"retryPolicy"` // the complete CUSTOM object, null for built-ins
	Status          string          `json:"status" openapi:"enum=ACTIVE|FORBIDDEN"`
	CreatedAt       time.Time       `json:"createdAt"`

	policy RetryPolicy // the expanded schedule, built-ins included
}

// ContractRetryPolicy is a contract's CUSTOM retry policy as sent.
type ContractRetryPolicy struct {
	Preset         jsonx.Optional[string]  `json:"preset" openapi:"enum=CUSTOM,notNull"`
	MaxAttempts    jsonx.Optional[int64]   `json:"maxAttempts" openapi:"required,min=1,max=10"`
	InitialDelayMs jsonx.Optional[int64]   `json:"initialDelayMs" openapi:"required,min=1,max=86400000"`
	Multiplier     jsonx.Optional[float64] `json:"multiplier" openapi:"required,min=1,max=10"`
	MaxDelayMs     jsonx.Optional[int64]   `json:"maxDelayMs" openapi:"required,min=1,max=86400000"`
	JitterPercent  jsonx.Optional[float64] `json:"jitterPercent" openapi:"required,min=0,max=100"`
}

// PublishContractRequest is the body of POST /api/v1/tools/{name}/contracts.
// retryPreset defaults to STANDARD, timeoutMs to 30000, status to ACTIVE,
// outputSchema to true (any output: a tool whose results are not checked;
// its input is what a replay is checked against, so that one is required).
type PublishContractRequest struct {
	HandlerVersion string               `json:"handlerVersion" openapi:"minLength=1,maxLength=100,toolname"`
	InputSchema    json.RawMessage      `json:"inputSchema" openapi:"required"`
	OutputSchema   json.RawMessage      `json:"outputSchema,omitempty"`
	TimeoutMs      *int64               `json:"timeoutMs,omitempty" openapi:"min=1000,max=86400000"`
	RetryPreset    *string              `json:"retryPreset,omitempty" openapi:"enum=STANDARD|AGGRESSIVE|RELAXED|CUSTOM"`
	RetryPolicy    *ContractRetryPolicy `json:"retryPolicy,omitempty"`
	Status         *string              `json:"status,omitempty" openapi:"enum=ACTIVE|FORBIDDEN"`
}

// contractRetryPolicy validates retryPreset and retryPolicy with the
// endpoint policy rules (one implementation): CUSTOM needs the complete
// policy, built-in presets take none.
func contractRetryPolicy(preset *string, rp *ContractRetryPolicy, p *apierr.Problems) RetryPolicy {
	name := PresetStandard
	if preset != nil {
		name = *preset
	}
	f := PolicyFields{Preset: jsonx.Optional[string]{Set: true, Value: name}}
	switch {
	case rp != nil && name != PresetCustom:
		p.Add("retryPolicy", "must be omitted unless retryPreset is CUSTOM")
	case rp == nil && name == PresetCustom:
		p.Add("retryPolicy", "is required with retryPreset CUSTOM (maxAttempts, initialDelayMs, multiplier, maxDelayMs, jitterPercent)")
	case rp != nil:
		if rp.Preset.Set && (rp.Preset.Null || rp.Preset.Value != PresetCustom) {
			p.Add("retryPolicy.preset", "must be CUSTOM")
		}
		f.MaxAttempts, f.InitialDelayMs, f.Multiplier = rp.MaxAttempts, rp.InitialDelayMs, rp.Multiplier
		f.MaxDelayMs, f.JitterPercent = rp.MaxDelayMs, rp.JitterPercent
	}
	var sub apierr.Problems
	pol := f.merge(defaultEndpointPolicy(), &sub)
	for _, e := range sub {
		switch {
		case e.Field == "preset":
			p.Add("retryPreset", "%s", e.Message)
		case rp != nil:
			p.Add("retryPolicy."+e.Field, "%s", e.Message)
		}
	}
	return pol.RetryPolicy
}

// checkSchema validates one schema field of a publication.
func checkSchema(field string, raw json.RawMessage, p *apierr.Problems) json.RawMessage {
	doc := bytes.TrimSpace(raw)
	switch {
	case len(doc) == 0 || bytes.Equal(doc, []byte("null")):
		p.Add(field, "is required (a JSON Schema 2020-12 object or boolean)")
		return nil
	case len(doc) > maxSchemaBytes:
		p.Add(field, "must be at most %d bytes", maxSchemaBytes)
		return nil
	case doc[0] != '{' && doc[0] != 't' && doc[0] != 'f':
		p.Add(field, "must be a JSON Schema object or boolean")
		return nil
	case nestsDeeperThan(doc, MaxSchemaDepth):
		p.Add(field, "must not nest objects and arrays more than %d levels deep", MaxSchemaDepth)
		return nil
	case possibleSubschemas(doc, MaxSchemaParts) > MaxSchemaParts:
		p.Add(field, "must hold at most %d objects and booleans (subschemas)", MaxSchemaParts)
		return nil
	}
	if err := publishableSchema(doc); err != nil {
		if problems := metaSchemaProblems(field, err); problems != nil {
			*p = append(*p, problems...)
		} else {
			p.Add(field, "%s", schemaCompileProblem(err))
		}
		return nil
	}
	return json.RawMessage(doc)
}

// anyOutput is the outputSchema of a contract published without one.
var anyOutput = json.RawMessage("true")

// ValidToolName reports whether name can name a tool.
func ValidToolName(name string) bool { return toolname.ValidName(name) }

// PublishContract publishes the next contract version of a tool. Versions
// are assigned per tool from 1 by one statement (an upsert of the tool's
// counter), so concurrent publications never share or skip a number.
func (s *Service) PublishContract(ctx context.Context, workspaceID, keyID, name string,
	req PublishContractRequest) (Contract, error) {
	var p apierr.Problems
	if !ValidToolName(name) {
		p.Add("name", toolname.NameRule)
	}
	if !toolname.ValidVersion(req.HandlerVersion) {
		p.Add("handlerVersion", toolname.VersionRule)
	}
	in := checkSchema("inputSchema", req.InputSchema, &p)
	out := anyOutput
	if len(req.OutputSchema) > 0 && !bytes.Equal(bytes.TrimSpace(req.OutputSchema), []byte("null")) {
		out = checkSchema("outputSchema", req.OutputSchema, &p)
	}
	timeout := int64(DefaultTimeoutMs)
	if req.TimeoutMs != nil {
		timeout = *req.TimeoutMs
		if timeout < MinTimeoutMs || timeout > MaxTimeoutMs {
			p.Add("timeoutMs", "%s", apierr.IntegerRule(MinTimeoutMs, MaxTimeoutMs))
		}
	}
	pol := contractRetryPolicy(req.RetryPreset, req.RetryPolicy, &p)
	status := ContractActive
	if req.Status != nil {
		status = *req.Status
		if status != ContractActive && status != ContractForbidden {
			p.Add("status", "must be ACTIVE or FORBIDDEN")
		}
	}
	if err := p.Err(); err != nil {
		return Contract{}, err
	}
	c, err := scanContract(db.Writer(ctx, s.pool).QueryRow(ctx, sqlPublishContract, workspaceID, name, req.HandlerVersion,
		string(in), string(out), timeout, pol.Preset, pol.MaxAttempts, pol.InitialDelayMs, pol.Multiplier,
		pol.MaxDelayMs, pol.JitterPercent, status, keyID, s.now()))
	if err != nil {
		return Contract{}, fmt.Errorf("publish contract: %w", err)
	}
	return c, nil
}

// ValidContractsCursor says whether cursor can be a contracts page's
// nextCursor (a contract version; "" for the first page).
func ValidContractsCursor(cursor string) bool { _, ok := contractsCursor(cursor); return ok }

// contractsCursor is the contract version a contracts page's cursor
// follows (0 for the first page), and whether it can be one.
func contractsCursor(cursor string) (int, bool) {
	if cursor == "" {
		return 0, true
	}
	n, ok := cursorNumber(cursor, 1, math.MaxInt32)
	return int(n), ok
}

// ListContracts pages through a tool's contracts by ascending
// contractVersion; cursor is the last version of the previous page. It
// reads only the contracts a page within the answer's budget (answer.Of)
// can use (sqlListContracts): fewer than limit, when their schemas are
// large.
func (s *Service) ListContracts(ctx context.Context, workspaceID, name, cursor string, limit int) ([]Contract, error) {
	if !ValidToolName(name) {
		return nil, apierr.InvalidField("name", toolname.NameRule)
	}
	after, ok := contractsCursor(cursor)
	if !ok {
		return nil, apierr.InvalidField("cursor", "is not a cursor from this API")
	}
	rows, err := s.pool.Query(ctx, sqlListContracts, workspaceID, name, after, limit, answer.Of(ctx))
	if err != nil {
		return nil, fmt.Errorf("list contracts: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Contract, error) { return scanContract(r) })
	if err != nil {
		return nil, fmt.Errorf("list contracts: %w", err)
	}
	return cs, nil
}

func scanContract(row pgx.Row) (Contract, error) {
	var c Contract
	var in, out []byte
	err := row.Scan(&c.Name, &c.ContractVersion, &c.HandlerVersion, &in, &out, &c.TimeoutMs, &c.policy.Preset,
		&c.policy.MaxAttempts, &c.policy.InitialDelayMs, &c.policy.Multiplier, &c.policy.MaxDelayMs,
		&c.policy.JitterPercent, &c.Status, &c.CreatedAt)
	if err != nil {
		return c, err
	}
	c.CreatedAt = c.CreatedAt.UTC()
	c.InputSchema, c.OutputSchema = in, out
	c.RetryPreset = c.policy.Preset
	if c.policy.Preset == PresetCustom {
		rp := c.policy
		c.RetryPolicy = &rp
	}
	return c, nil
}

// contractByVersion reads one contract; nil when there is none.
func (s *Service) contractByVersion(ctx context.Context, q db.Querier, workspaceID, name string, version int64) (*Contract, error) {
	if version > math.MaxInt32 {
		return nil, nil // none is numbered so (contract_version is an int)
	}
	c, err := scanContract(q.QueryRow(ctx, sqlContractByVersion, workspaceID, name, version))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read contract: %w", err)
	}
	return &c, nil
}

// noContractNumbered refuses a contract version (tool name, version) no
// contract of the tool has: a number beyond contract_version's int range
// included, which no contract can have (a field tagged min=1 alone, whose
// number that is no integer the decoder tells "from 1 to 2^63-1").
const noContractNumbered = "must be a contract of tool %s: none is numbered %d"

// typeMax is the upper bound the decoder (lib/jsonstrict) tells an int64
// field whose openapi tag gives no max: its handler, refusing a number
// below the tagged min, tells the same rule (apierr.IntegerRule).
const typeMax = "2^63-1"

// checkContract reads the contract jobs_enqueue selected for an enqueue
// (the explicit contractVersion, else the latest ACTIVE contract of
// name@version, else the latest of its contracts) and checks it: it must
// exist, be for this handler version and not be FORBIDDEN (an implicit
// selection is only when name@version has no ACTIVE contract), and the
// saved input must validate against its inputSchema.
func (s *Service) checkContract(ctx context.Context, q db.Querier, workspaceID string, op enqueueOp,
	version int64) (*Contract, error) {
	c, err := s.contractByVersion(ctx, q, workspaceID, op.name, version)
	switch {
	case err != nil:
		return nil, err
	case c == nil:
		return nil, apierr.InvalidField("contractVersion", noContractNumbered, op.name, version)
	case c.HandlerVersion != op.version:
		return nil, apierr.InvalidField("version", "must be %s, the handlerVersion of contract %d",
			c.HandlerVersion, c.ContractVersion)
	case c.Status == ContractForbidden:
		return nil, apierr.InvalidState("Contract %d of tool %s is FORBIDDEN; it cannot be used.",
			c.ContractVersion, op.name)
	}
	problems, err := validateDoc(c.InputSchema, op.input, "input")
	if err != nil {
		return nil, err
	}
	if problems != nil {
		return nil, apierr.Invalid(problems...)
	}
	return c, nil
}

// outputRejection validates a SUCCEEDED report's output against the job's
// contract; it answers the warning recorded on the execution when the
// output is refused, or "" when it is accepted.
func outputRejection(outputSchema []byte, contractVersion int, output json.RawMessage) (string, error) {
	rejection, _, err := outputRejectionWithin(outputSchema, contractVersion, output, MaxCheckEvaluations)
	return rejection, err
}

// outputRejectionWithin is outputRejection held to budget evaluations
// (validateDocWithin): it answers the evaluations it counted too, and
// errOverBudget, having checked nothing, for an output whose check could
// take more than a budget below MaxCheckEvaluations.
func outputRejectionWithin(outputSchema []byte, contractVersion int, output json.RawMessage, budget int64) (
	string, int64, error) {
	doc := bytes.TrimSpace(output)
	if len(doc) == 0 {
		doc = []byte("null")
	}
	problems, n, err := validateDocWithin(outputSchema, doc, "output", budget)
	if err != nil || problems == nil {
		return "", n, err
	}
	parts := make([]string, 0, len(problems))
	for _, pr := range problems {
		parts = append(parts, pr.Field+" "+pr.Message)
	}
	// Held to what a worker's own message may hold (maxErrorMessage): it
	// is the attempt's errorMessage and warning both, and a step answers
	// its attempts whole (size QA: twenty problems under long keys made
	// one attempt of megabytes).
	head := fmt.Sprintf("Output rejected by contract %d's outputSchema (", contractVersion)
	const tail = "); not retried."
	listed := cutMessage(strings.Join(parts, "; "), maxErrorMessage-utf8.RuneCountInString(head)-len(tail))
	return head + listed + tail, n, nil
}

// cutMessage is msg when it holds at most n characters, and otherwise its
// first n-1 and "…".
func cutMessage(msg string, n int) string {
	if utf8.RuneCountInString(msg) <= n {
		return msg
	}
	i := 0
	for j := range msg {
		if i == n-1 {
			return msg[:j] + "…"
		}
		i++
	}
	return msg
}

// outputChecks are a report request's checks of its successes' outputs
// against their jobs' contracts: one budget for them all, MaxCheckEvaluations
// (the evaluations one report's check may take), not one each. A batch of
// 100 successes held to a budget each could check for 100 times a report's
// time, inside the transaction holding the batch's job locks (review: one
// 160-byte output against a publishable outputSchema, an allOf of 1 500
// $refs to one anyOf, took 16.5 s; a batch of 100 such, half an hour). A
// batch whose outputs the budget cannot cover is refused whole, having
// recorded nothing (errReportsTooCostly), rather than answered report by
// report: every worker SDK, of every release, sends a batch refused so
// again report by report (each then has the whole budget), while each
// counts a report refused in its slot as the server's last word on it,
// its outcome lost. The checks are made under the jobs' locks, where their
// contracts are read: made before, they would cost every batch of
// successes a round trip more. They are kept (done) across the
// transaction's retries.
type outputChecks struct {
	left int64
	done map[string]checkedOutput // by job id
}

// checkedOutput is one report's checked output: its rejection ("" when the
// output is accepted) under the contract it was checked against.
type checkedOutput struct {
	contractVersion int32
	rejection       string
}

func newOutputChecks() *outputChecks {
	return &outputChecks{left: MaxCheckEvaluations, done: map[string]checkedOutput{}}
}

// errReportsTooCostly refuses a batch whose successes' outputs, together,
// the budget cannot check (outputChecks).
func errReportsTooCostly() error {
	return apierr.InvalidField("reports", "hold successes whose outputs would together take more than %d "+
		"subschema evaluations to check against their contracts' outputSchemas, what one report's check may "+
		"take; nothing was recorded: send them in smaller batches, or one by one (POST /api/v1/jobs/{id}/report)",
		MaxCheckEvaluations)
}

// check checks one output against contract contractVersion's schema from
// what is left of the budget, and keeps its rejection for jobID. It
// answers errOverBudget, having checked nothing, when what is left could
// not cover the check (the first check has the whole budget: an output
// whose check could take more is rejected, as a single report's is).
func (c *outputChecks) check(jobID string, schema []byte, contractVersion int32, output json.RawMessage) (string, error) {
	rejection, n, err := outputRejectionWithin(schema, int(contractVersion), output, max(c.left, 0))
	if err != nil {
		return "", err
	}
	c.left -= n
	c.done[jobID] = checkedOutput{contractVersion: contractVersion, rejection: rejection}
	return rejection, nil
}

// output answers the rejection of j's output (under j's lock), checked
// from what is left of the budget: errOverBudget, having checked nothing,
// when what is left cannot cover it (the request is then refused whole).
func (c *outputChecks) output(ctx context.Context, q db.Querier, j *lockedJob, output json.RawMessage) (string, error) {
	if d, ok := c.done[j.jobID]; ok && d.contractVersion == *j.contractVersion {
		return d.rejection, nil
	}
	var schema []byte
	err := q.QueryRow(ctx, sqlOutputSchema, j.workspaceID, j.name, *j.contractVersion).Scan(&schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("output schema: %w", err)
	}
	return c.check(j.jobID, schema, *j.contractVersion, output)
}
