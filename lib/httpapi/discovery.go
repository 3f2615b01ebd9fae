package httpapi

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

// Manifest is the capability manifest at /.well-known/ratchet.json. It is
// built from the code alone (NewManifest), so none of its lists or maps is
// ever null.
type Manifest struct {
	Name      string              `json:"name"`
	Version   string              `json:"version"`
	APIBase   string              `json:"api_base"`
	OpenAPI   string              `json:"openapi"`
	LLMsTxt   string              `json:"llms_txt"`
	Routes    []ManifestRoute     `json:"routes" openapi:"notNull"`
	Decisions []string            `json:"decisions" openapi:"notNull"`
	Scopes    []string            `json:"scopes" openapi:"notNull"`
	Presets   map[string][]string `json:"presets" openapi:"valueNotNull"`
	Errors    map[string]int      `json:"errors"`
	Limits    map[string]int64    `json:"limits"`
	MCP       ManifestMCP         `json:"mcp"`
}

// ManifestMCP says where the MCP tools are, and what they take.
type ManifestMCP struct {
	Endpoint  string   `json:"endpoint"`
	Transport string   `json:"transport"`
	Stdio     string   `json:"stdio"`
	Tools     []string `json:"tools" openapi:"notNull"`
	// ToolDefinitions are the tools as tools/list describes them, readable
	// without a key, as the OpenAPI document is (the MCP endpoint needs
	// one even to list them).
	ToolDefinitions []*mcp.Tool `json:"tool_definitions" openapi:"notNull"`
	// Instructions are initialize's: how an agent uses the gate.
	Instructions string `json:"instructions"`
}

// ManifestRoute is one route in the manifest.
type ManifestRoute struct {
	Method string   `json:"method"`
	Path   string   `json:"path"`
	Name   string   `json:"name"`
	Scopes []string `json:"scopes" openapi:"notNull"` // [] for none (NewManifest)
	// AnyScopes, when present, are alternatives: one of them is needed too.
	AnyScopes []string `json:"any_scopes,omitempty"`
	Public    bool     `json:"public"`
}

// Decisions are begin's answers (API.md §2.1).
var Decisions = []string{"execute", "duplicate", "in_flight", "blocked", "approval_required", "denied"}

// Limits published by the API.
var Limits = map[string]int64{
	"request_body_bytes": MaxBodyBytes,
	// The most one answer holds: a list's page ends early before it, and a
	// reconciliation past it is refused (answer.Budget).
	"answer_bytes_max":    answer.Budget,
	"result_bytes":        256 << 10,
	"list_limit_max":      200,
	"list_limit_default":  50,
	"idempotency_key_max": 255,
	// A policy's lease_seconds (the names earlier releases published); a
	// begin may ask for a shorter lease, down to a second, and never gets
	// more than its policy's (QA: the 5 was read as begin's minimum).
	"lease_seconds_min":       5,
	"lease_seconds_max":       3600,
	"begin_lease_seconds_min": 1,
	"effect_max_attempts":     50,
	"job_max_attempts":        10,
	"claim_batch_max":         100,
	"claim_wait_seconds_max":  20,
	"retry_after_ms_min":      1000,
	"retry_after_ms_max":      86_400_000,
	// The most forward steps one effect group takes: a begin that would
	// add another is 409 invalid_state.
	"group_steps_max": gate.MaxGroupSteps,
}

var (
	manifestOnce sync.Once
	manifestDoc  Manifest
)

// manifest is the manifest, built once per instance as the OpenAPI
// document is: it depends only on the code (its MCP tool schemas included).
func manifest() Manifest {
	manifestOnce.Do(func() { manifestDoc = NewManifest() })
	return manifestDoc
}

// NewManifest builds the manifest from the route table.
func NewManifest() Manifest {
	m := Manifest{
		Name: "ratchet", Version: Version, APIBase: "/api/v1",
		OpenAPI: "/api/v1/openapi.json", LLMsTxt: "/llms.txt",
		Decisions: Decisions, Scopes: auth.AllScopes, Presets: auth.Presets,
		Errors: apierr.Statuses, Limits: Limits,
		MCP: ManifestMCP{Endpoint: "/api/v1/mcp", Transport: "streamable-http (stateless, JSON responses)",
			Stdio: "go build -o ratchet-mcp ./functions/mcp, then launch it by its absolute path " +
				"(RATCHET_BASE_URL, RATCHET_API_KEY)", Tools: mcpserver.ToolNames(),
			ToolDefinitions: mcpserver.ToolDefinitions(), Instructions: mcpserver.Instructions},
	}
	for _, r := range Routes() {
		scopes := r.Scopes
		if scopes == nil {
			scopes = []string{}
		}
		m.Routes = append(m.Routes, ManifestRoute{Method: r.Method, Path: r.Pattern, Name: r.Name,
			Scopes: scopes, AnyScopes: r.AnyScopes, Public: r.Auth == AuthNone})
	}
	return m
}

const llmsIntro = `# Ratchet

> Ratchet is the reliability layer an agent or a job asks before a side effect
> (an email, a charge, a vendor call): retries never double-act, crashes never
> lose the record, runaway loops are stopped before they cost money.

## Get a key

POST /api/v1/workspaces {"name": "acme"} returns {"workspace_id", "name", "key": {"id", "secret", "scopes", ...}}.
The secret is shown once. Send it as Authorization: Bearer <secret>.
Give an agent a narrower key: POST /api/v1/keys {"name": "agent", "preset": "AGENT"}.
GET /api/v1/keys/current tells any key what it is: its scopes, tools, spend ceiling and rate limit.
Each key names the key that minted it (created_by_key_id). Revoking a key leaves the keys it minted
live: GET /api/v1/keys?created_by=<key id> lists them. A key found compromised:
DELETE /api/v1/keys/<key id>?include_minted=true revokes it and every live key minted from it, down the tree,
at once (answered in "minted_revoked"); refused whole, nothing revoked, if a key of the tree is one yours may
not revoke (403, error.detail.key_id) or the workspace's last root key (409).

## Ask before you act

POST /api/v1/effects/begin {"effect_type": "email.send", "idempotency_key": "welcome-email:user_123", "payload": {...}}
Branch on "decision":
- execute: you hold the lease. Perform the action, then report.
  With "probe": true, an earlier attempt's outcome is unknown (prior_attempt):
  first check at the vendor whether it happened; if it did, report succeeded
  with what it did instead of acting again.
- duplicate: already completed. Use "result". Do not act.
- in_flight: someone else holds a live lease. Wait retry_after_seconds, ask again.
  Send "request_id" (16+ random characters, fresh per call, the same in its retries):
  a retry by the same key after a lost answer then gets the same execute and
  lease_token, not in_flight.
- blocked: a prior attempt's outcome is unknown. Verify at the vendor, then resolve,
  sending "attempt": prior_attempt.attempt, so a retried resolve never settles
  a later attempt nobody checked (another is 409 invalid_state).
- approval_required: an operator decision is pending. Poll, or wait for the webhook;
  then begin again with the same key and payload.
- denied (HTTP 403): policy, budget or rejection. Report the reason. Do not work around it.

## Report what happened

POST /api/v1/effects/{id}/report {"lease_token", "outcome": "succeeded"|"failed", "result": {...}}
Report failed only when you know the action did not reach the outside world.
If you are unsure (a timeout, a dropped connection) report nothing: the lease
lapses and Ratchet records an honest indeterminate. A false failed licenses a duplicate.
A report refused 409 lease_expired or lease_lost was not recorded: do not act
again; if the action happened, an operator records it with resolve.

## Idempotency keys

Derive the key from the work, deterministically (refund:order_551:full), never
from a UUID, a clock or an attempt number. Reusing a key for different arguments
is 409 idempotency_key_reuse. For sensitive results, blind the key:
hex(hmac_sha256(your_secret, key))[:32].

Creates without a key field (keys, webhooks, a webhook's secret rotation and
delivery retry, contract publish, tool test, worker registration, step replay,
reconciliation), a run's start and a group's open (with their body key or
without: the header keeps the 201 or the deduplicated 200), and the actions
whose repeat would undo what another actor changed since (a policy update without expected_version, a circuit's open
and close, the emergency stop and its release, a step's cancel, an endpoint's
pause, resume and circuit close, a webhook's update), all marked [Idempotency-Key] below, take an Idempotency-Key header:
send the same request again under it, the body byte for byte, and get the
first answer, not a second key, webhook, run, group or replay, nor a close of a breaker
that tripped again since or a cancel of a step replayed since. The
key names one intended create for 24 hours (replay:<step>:<attempt>, not
replay:<step>: a later replay under it gets the old answer). 409
retry_request: the first is still acting (whatever the body sent); wait
detail.retry_after_seconds.
A request's work and its answer commit together: one that failed (4xx, 500,
503 with outcome not_applied) changed nothing and frees the key; one whose
commit's outcome is unknown (503, outcome unknown) holds it 30 seconds, then a
retry gets the answer if it committed and acts if it did not. A key's revoke
and a webhook's delete erase the answers that showed its secret (the key's
create; the webhook's create, rotate-secret): sent again, such a request is
404 not_found (Idempotent-Replayed: true).

## MCP

Nine tools (ratchet_begin, ratchet_report, ...) at /api/v1/mcp over streamable HTTP
(send your key as Authorization: Bearer), or over stdio: go build -o ratchet-mcp
./functions/mcp, then have the client launch that binary by its absolute path.

## Lists

Lists take ?limit= (1-200, default 50) and ?cursor= (the previous page's
next_cursor, nextCursor on job routes). A page holds at most limit items and
at most about 4 MB: it may end early, so page on until the cursor is null.
A read whose lists could pass that holds part of them and says so: a run's
stepsTruncated (GET /api/v1/runs/{id}/steps pages them all), a group's
steps_truncated (GET /api/v1/groups/{id}/steps), a step's attemptsTruncated and
replaysTruncated (its last 50 of each; GET /api/v1/steps/{id}/attempts and
/replays), an unwind's plan_truncated (perform the plan, then unwind again).

## Errors

Every failure is {"error": {"code", "message", "detail"}}. Branch on code.

## Routes
`

// LLMsText is the plain-text guide served at /llms.txt.
func LLMsText() string {
	var b strings.Builder
	b.WriteString(llmsIntro)
	routes := Routes()
	sort.SliceStable(routes, func(i, j int) bool { return routes[i].Pattern < routes[j].Pattern })
	for _, r := range routes {
		scopes := ""
		if len(r.Scopes) > 0 {
			scopes = " [" + strings.Join(r.Scopes, ", ") + "]"
		}
		if len(r.AnyScopes) > 0 {
			scopes += " [" + strings.Join(r.AnyScopes, " or ") + "]"
		}
		if r.Idempotent {
			scopes += " [Idempotency-Key]"
		}
		fmt.Fprintf(&b, "- %s %s%s: %s\n", r.Method, r.Pattern, scopes, r.Summary)
	}
	b.WriteString("\nFull schemas: /api/v1/openapi.json. Capabilities: /.well-known/ratchet.json.\n")
	return b.String()
}
