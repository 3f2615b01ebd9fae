package httpapi

import (
	"context"
	"strconv"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
)

// contractsRoutes are tool contracts, synthetic tool tests and step replay
// (API.md §3.2). Scopes: publishing and testing need contracts:write;
// listing contracts needs runs:read, so producers (INGEST keys) can pin a
// contractVersion; the replay preview and replay need steps:replay (the
// preview decrypts saved input to check it against each target).
func (s *Server) contractsRoutes() []Route {
	write, read := []string{auth.ScopeContractsWrite}, []string{auth.ScopeRunsRead}
	replay := []string{auth.ScopeStepsReplay}
	return []Route{
		{
			Method: "POST", Pattern: "/api/v1/tools/{name}/contracts", Name: "contracts.publish", Tag: "contracts",
			Scopes: write, Idempotent: true,
			Summary: "Publish the tool's next contract version (from 1, per tool): handlerVersion, JSON Schema " +
				"2020-12 inputSchema and outputSchema (default true: any output; compiled now; external $refs " +
				"refused), timeoutMs (default " +
				"30000), retryPreset (default STANDARD; CUSTOM needs the complete retryPolicy, built-ins take none) " +
				"and status ACTIVE (default) or FORBIDDEN. Contracts are immutable.",
			Request: jobs.PublishContractRequest{}, Response: jobs.Contract{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest}, Handle: s.publishContract,
		},
		{
			Method: "GET", Pattern: "/api/v1/tools/{name}/contracts", Name: "contracts.list", Tag: "contracts",
			Scopes: read, Query: camelListParams,
			Summary:  "List the tool's contracts by ascending contractVersion (cursor: the last contractVersion).",
			Response: CamelPage[jobs.Contract]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: jobs.ValidContractsCursor,
			Handle: s.listContracts,
		},
		{
			Method: "POST", Pattern: "/api/v1/tools/{name}/test", Name: "tools.test", Tag: "contracts", Scopes: write,
			Idempotent: true,
			Summary: "Enqueue a synthetic one-attempt job of name@version in a new synthetic run (completion already " +
				"requested). The implicit contract of name@version applies: input and output are validated, its " +
				"timeout is used, maxAttempts is always 1. Answers the run, step and job ids.",
			Request: jobs.ToolTestRequest{}, Response: jobs.ToolTestResult{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeInvalidState},
			Handle: s.testTool,
		},
		{
			Method: "GET", Pattern: "/api/v1/steps/{id}/replay", Name: "steps.replay.preview", Tag: "jobs",
			Scopes: replay,
			Summary: "Preview a replay: eligible (job EXHAUSTED or CANCELLED, its afterStepId dependency ended as " +
				"it needs, and when handlerVersionForbidden (every contract of its handler version is FORBIDDEN, " +
				"so only an upgrade replays it) some upgrade not FORBIDDEN accepts its input) and, when not, " +
				"ineligibleReason; the current handlerVersion (send it " +
				"back as expectedHandlerVersion) and upgrades[]: every other contract of the tool with compatible " +
				"(the saved input validates against its inputSchema; the input is never returned) and forbidden; the " +
				"input is checked against all targets within one enqueue's budget (compiling each target's schema " +
				"counted in it), newest first, and a target it " +
				"does not reach reads checked false (and compatible false, with validation [{field: input}] saying " +
				"it was not checked): eligible counts it as one that may fit, and a replay onto it checks it. " +
				"inputUnreadable: true when this server cannot decrypt the saved input (its encryption key is not " +
				"configured, or it is damaged): no upgrade then reads compatible (each reads checked false), and a " +
				"replay answers 500.",
			Response: jobs.ReplayPreview{}, Status: 200, Errors: []string{apierr.CodeNotFound}, Handle: s.previewReplay,
		},
		{
			Method: "POST", Pattern: "/api/v1/steps/{id}/replay", Name: "steps.replay", Tag: "jobs", Scopes: replay,
			Idempotent: true,
			Summary: "Replay an EXHAUSTED or CANCELLED step's job (the same job) with maxAttempts (1-10, default 1) " +
				"additional executions; acknowledgeDuplicateRisk: true is required. targetContractVersion upgrades " +
				"it (expectedHandlerVersion and acknowledgeVersionChange: true required, but for the step's own " +
				"contractVersion, a same-version replay that needs neither; a FORBIDDEN or incompatible " +
				"target is 409 invalid_state; so is a same-version replay of a handler version whose every contract " +
				"is FORBIDDEN, as its enqueue is, and a replay of a synthetic tool test's step, which has exactly " +
				"one attempt). A replay, of the same version or onto a target, when this server " +
				"cannot decrypt the saved input (inputUnreadable) is 500 internal_error, changing nothing. A FAILED " +
				"run whose only failed step this was goes back to RUNNING; a paused endpoint holds the job. A step cancelled while it ran is claimed only once that " +
				"attempt has reported or its lease (leaseExpiresAt) has expired: never two attempts at once. Its " +
				"dueAt is that expiry until the attempt reports, then the report's time. The " +
				"duplicate risk acknowledged is an earlier attempt's side effect done though its outcome was not recorded.",
			Request: jobs.ReplayRequest{}, Response: jobs.ReplayResult{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeInvalidState,
				apierr.CodeVersionConflict},
			ChecksKey: true,
			Handle:    s.replayStep,
		},
	}
}

func (s *Server) publishContract(ctx context.Context, c *Call) (any, error) {
	var req jobs.PublishContractRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.PublishContract(ctx, c.Principal.WorkspaceID, c.Principal.KeyID, c.R.PathValue("name"), req)
}

func (s *Server) listContracts(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	cs, err := s.Jobs.ListContracts(ctx, c.Principal.WorkspaceID, c.R.PathValue("name"), cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewCamelPage(ctx, cs, limit, func(x jobs.Contract) string { return strconv.Itoa(x.ContractVersion) })
}

func (s *Server) testTool(ctx context.Context, c *Call) (any, error) {
	var req jobs.ToolTestRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.TestTool(ctx, c.Principal, c.R.PathValue("name"), req)
}

func (s *Server) previewReplay(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Step)
	if err != nil {
		return nil, err
	}
	return s.Jobs.PreviewReplay(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) replayStep(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Step)
	if err != nil {
		return nil, err
	}
	var req jobs.ReplayRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Jobs.Replay(ctx, c.Principal, id, req)
}
