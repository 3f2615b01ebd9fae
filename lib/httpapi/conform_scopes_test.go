package httpapi_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/httpapi"
)

// routeScopes is what each route requires: every scope of the first list,
// and one of the second when it has one (Route.AnyScopes).
type routeScopes struct{ all, anyOf []string }

// The route table's authorization, pinned: which routes anyone may call,
// and the scopes every keyed route requires, as API.md and README give them
// (approvals:write for every approvals route, GET /approvals included;
// policies:write for every circuit action; steps:replay for both replay
// routes; ...). TestScopeMatrix checks that a route refuses a key without
// the scopes the table names; this checks the table names the right ones,
// so a route added with none (open to every key: an AGENT key could call
// it) or a scope loosened fails here until it is listed on purpose
// (security review: nothing held a route's scopes to the contract). Only
// keys.current (the calling key itself) and the MCP endpoint (each tool
// call is the REST call it names, with that call's scopes) take any key.
func TestEveryRouteRequiresTheScopesTheContractGivesIt(t *testing.T) {
	t.Parallel()
	public := map[string]httpapi.AuthMode{
		"health": httpapi.AuthNone, "workspaces.create": httpapi.AuthNone, "discovery.openapi": httpapi.AuthNone,
		"discovery.llms": httpapi.AuthNone, "discovery.manifest": httpapi.AuthNone,
		"cron.sweep": httpapi.AuthCron, "cron.sweep.post": httpapi.AuthCron,
	}
	keyed := map[string]routeScopes{
		"keys.create":               {all: []string{"keys:write"}},
		"keys.list":                 {all: []string{"keys:write"}},
		"keys.current":              {},
		"keys.revoke":               {all: []string{"keys:write"}},
		"effects.begin":             {all: []string{"effects:begin"}},
		"effects.list":              {all: []string{"effects:read"}},
		"effects.get":               {all: []string{"effects:read"}},
		"effects.report":            {all: []string{"effects:report"}},
		"effects.heartbeat":         {all: []string{"effects:report"}},
		"effects.resolve":           {all: []string{"effects:resolve"}},
		"policies.list":             {all: []string{"policies:read"}},
		"policies.get":              {all: []string{"policies:read"}},
		"policies.structuring":      {all: []string{"policies:read"}},
		"policies.put":              {all: []string{"policies:write"}},
		"approvals.list":            {all: []string{"approvals:write"}},
		"approvals.get":             {all: []string{"approvals:write"}},
		"approvals.approve":         {all: []string{"approvals:write"}},
		"approvals.reject":          {all: []string{"approvals:write"}},
		"runs.create":               {all: []string{"runs:write"}},
		"runs.list":                 {all: []string{"runs:read"}},
		"runs.steps":                {all: []string{"runs:read"}},
		"runs.get":                  {all: []string{"runs:read"}},
		"runs.enqueue":              {all: []string{"runs:write"}},
		"runs.finish":               {all: []string{"runs:write"}},
		"steps.get":                 {all: []string{"runs:read"}},
		"steps.attempts":            {all: []string{"runs:read"}},
		"steps.replays":             {all: []string{"runs:read"}},
		"steps.cancel":              {all: []string{"runs:write"}},
		"workers.register":          {all: []string{"jobs:work"}},
		"workers.claim":             {all: []string{"jobs:work"}},
		"jobs.heartbeat":            {all: []string{"jobs:work"}},
		"jobs.report":               {all: []string{"jobs:work"}},
		"jobs.report.batch":         {all: []string{"jobs:work"}},
		"endpoints.list":            {all: []string{"runs:read"}},
		"endpoints.create":          {all: []string{"endpoints:write"}},
		"endpoints.policy.get":      {all: []string{"runs:read"}},
		"endpoints.attempts":        {all: []string{"runs:read"}},
		"endpoints.policy.put":      {all: []string{"endpoints:write"}},
		"endpoints.pause":           {all: []string{"endpoints:write"}},
		"endpoints.resume":          {all: []string{"endpoints:write"}},
		"endpoints.circuit.close":   {all: []string{"endpoints:write"}},
		"queue.health":              {all: []string{"runs:read"}},
		"webhooks.create":           {all: []string{"webhooks:write"}},
		"webhooks.list":             {all: []string{"webhooks:write"}},
		"webhooks.get":              {all: []string{"webhooks:write"}},
		"webhooks.delete":           {all: []string{"webhooks:write"}},
		"webhooks.update":           {all: []string{"webhooks:write"}},
		"webhooks.rotate_secret":    {all: []string{"webhooks:write"}},
		"webhooks.deliveries":       {all: []string{"webhooks:write"}},
		"webhooks.deliveries.retry": {all: []string{"webhooks:write"}},
		"groups.create":             {all: []string{"effects:begin"}},
		"groups.get":                {anyOf: []string{"effects:read", "effects:begin"}},
		"groups.steps":              {anyOf: []string{"effects:read", "effects:begin"}},
		"groups.commit":             {all: []string{"effects:begin"}},
		"groups.unwind":             {all: []string{"effects:begin"}},
		"reconcile":                 {all: []string{"reconcile:write"}},
		"mcp.post":                  {},
		"mcp.get":                   {},
		"mcp.delete":                {},
		"contracts.publish":         {all: []string{"contracts:write"}},
		"contracts.list":            {all: []string{"runs:read"}},
		"tools.test":                {all: []string{"contracts:write"}},
		"steps.replay.preview":      {all: []string{"steps:replay"}},
		"steps.replay":              {all: []string{"steps:replay"}},
		"circuits.list":             {anyOf: []string{"policies:write", "policies:read"}},
		"circuits.stop.get":         {anyOf: []string{"policies:write", "policies:read"}},
		"circuits.stop":             {all: []string{"policies:write"}},
		"circuits.release":          {all: []string{"policies:write"}},
		"circuits.open":             {all: []string{"policies:write"}},
		"circuits.close":            {all: []string{"policies:write"}},
	}
	seen := map[string]bool{}
	for _, r := range httpapi.Routes() {
		require.False(t, seen[r.Name], "%s is named twice", r.Name)
		seen[r.Name] = true
		if r.Auth != httpapi.AuthKey {
			mode, ok := public[r.Name]
			require.True(t, ok, "%s %s takes no API key: list it as public if it must", r.Method, r.Pattern)
			require.Equal(t, mode, r.Auth, r.Name)
			continue
		}
		want, ok := keyed[r.Name]
		require.True(t, ok, "%s %s: list the scopes it requires", r.Method, r.Pattern)
		require.Equal(t, want.all, r.Scopes, "%s %s: its scopes", r.Method, r.Pattern)
		require.Equal(t, want.anyOf, r.AnyScopes, "%s %s: the scopes one of which it requires", r.Method, r.Pattern)
	}
	require.Len(t, seen, len(public)+len(keyed), "every route listed is in the table")
}
