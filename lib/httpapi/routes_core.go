package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/sweep"
)

// SignupRequest is the body of POST /api/v1/workspaces.
type SignupRequest struct {
	Name string `json:"name" openapi:"required,minLength=1,maxLength=100"`
}

// SignupResponse returns the workspace and its operator key, secret shown once.
type SignupResponse struct {
	WorkspaceID string      `json:"workspace_id"`
	Name        string      `json:"name"`
	Key         auth.NewKey `json:"key"`
}

// HealthResponse answers GET /api/v1/health.
type HealthResponse struct {
	OK bool `json:"ok"`
}

func (s *Server) coreRoutes() []Route {
	return []Route{
		{
			Method: "GET", Pattern: "/api/v1/health", Name: "health", Tag: "operations", Auth: AuthNone,
			Summary:  "Liveness and database reachability: 200 when Postgres answers, 503 otherwise.",
			Response: HealthResponse{}, Status: 200, Errors: []string{apierr.CodeDatabaseUnavailable},
			Handle: s.health,
		},
		{
			Method: "POST", Pattern: "/api/v1/workspaces", Name: "workspaces.create", Tag: "workspaces", Auth: AuthNone,
			Summary: "Create a workspace with starter policies and return an OPERATOR key (secret shown once). " +
				"SIGNUP_MODE=token requires the Ratchet-Signup-Token header; past " +
				strconv.Itoa(auth.SignupTokenMissesPerHour) + " wrong tokens in a clock hour (UTC), on every " +
				"instance together, every token, the right one too, is refused 429 rate_limited until the hour ends.",
			Request: SignupRequest{}, Response: SignupResponse{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeForbidden, apierr.CodeUnauthorized, apierr.CodeRateLimited,
				apierr.CodeDatabaseUnavailable},
			Handle: s.signup,
		},
		{
			Method: "POST", Pattern: "/api/v1/keys", Name: "keys.create", Tag: "keys", Scopes: []string{auth.ScopeKeysWrite},
			Idempotent: true, ChecksKey: true, // the mint holds its minter's row (auth.RequireLive)
			Summary: "Mint a key with scopes (or a preset) no wider than the caller's own; the secret is shown once. " +
				"Sent again under its Idempotency-Key once the key was revoked: 404 not_found (" +
				ReplayedHeader + ": true), the answer that showed the secret erased with it.",
			Request: auth.CreateKeyRequest{}, Response: auth.NewKey{}, Status: 201,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound},
			Handle: s.createKey,
		},
		{
			Method: "GET", Pattern: "/api/v1/keys", Name: "keys.list", Tag: "keys", Scopes: []string{auth.ScopeKeysWrite},
			Summary: "List the workspace's keys oldest first (never their secrets); ?created_by= a key id lists the " +
				"keys that key minted (revoking a key leaves them live, unless revoked with ?include_minted=true).",
			Query: append([]Param{{Name: "created_by", Type: "string", Description: "only the keys this key " +
				"minted (their created_by_key_id); another workspace's key, or none, lists nothing",
				Pattern: ids.Pattern(ids.Key), MaxLength: ids.Len(ids.Key), Valid: idCursor(ids.Key),
				Rule: createdByRule}}, listParams...),
			Response: Page[auth.Key]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: idCursor(ids.Key),
			Handle: s.listKeys,
		},
		{
			Method: "GET", Pattern: "/api/v1/keys/current", Name: "keys.current", Tag: "keys",
			Summary: "The calling key itself (never its secret): its scopes, tools, spend ceiling and rate limit. " +
				"Any valid key may read itself, whatever its scopes: an agent or a console learns what it may do " +
				"before it is refused.",
			Response: auth.Key{}, Status: 200,
			Handle: func(ctx context.Context, c *Call) (any, error) {
				return s.Auth.CurrentKey(ctx, c.Principal)
			},
		},
		{
			Method: "DELETE", Pattern: "/api/v1/keys/{id}", Name: "keys.revoke", Tag: "keys", Scopes: []string{auth.ScopeKeysWrite},
			ChecksKey: true, // the revoke locks its caller's row with the keys it revokes
			Summary: "Revoke a key for good; returns the revoked key. The answer kept for its create's " +
				"Idempotency-Key is erased with it (sent again, the create is 404). Every call that changes something honours it " +
				"at once on every instance; reads, reports and heartbeats within KEY_CACHE_TTL. " +
				"The workspace's last root key (every scope, no tools, no ceiling) cannot be revoked (409 invalid_state). " +
				"The keys it minted stay live, unless ?include_minted=true: then every live key minted from it, down " +
				"the tree (through keys revoked before), is revoked with it in one transaction, listed in minted_revoked; " +
				"a key of the tree this key may not revoke, or the last root key among them, refuses it all (detail.key_id " +
				"names which), nothing revoked.",
			Query: []Param{{Name: "include_minted", Type: "boolean", Description: "true also revokes every live key " +
				"minted from this one (created_by_key_id), their own minted keys, and so on, answered in " +
				"minted_revoked; false or left out revokes this key alone"}},
			Response: auth.RevokedKey{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeInvalidState,
				apierr.CodeRetryRequest},
			Handle: s.revokeKey,
		},
		{
			Method: "GET", Pattern: "/api/v1/openapi.json", Name: "discovery.openapi", Tag: "discovery", Auth: AuthNone,
			Summary: "This API's OpenAPI 3.1 document.", Response: map[string]any{}, Status: 200,
			Handle: func(context.Context, *Call) (any, error) { return OpenAPI(), nil },
		},
		{
			Method: "GET", Pattern: "/llms.txt", Name: "discovery.llms", Tag: "discovery", Auth: AuthNone,
			Summary: "A plain-text guide for agents.", ContentType: "text/plain; charset=utf-8", Status: 200,
			Handle: func(context.Context, *Call) (any, error) {
				return Text{ContentType: "text/plain; charset=utf-8", Body: LLMsText()}, nil
			},
		},
		{
			Method: "GET", Pattern: "/.well-known/ratchet.json", Name: "discovery.manifest", Tag: "discovery", Auth: AuthNone,
			Summary: "Capability manifest: version, routes, decisions, scopes, limits.", Response: Manifest{}, Status: 200,
			Handle: func(context.Context, *Call) (any, error) { return manifest(), nil },
		},
		{
			Method: "GET", Pattern: "/api/cron/sweep", Name: "cron.sweep", Tag: "operations", Auth: AuthCron,
			Summary:  "One bounded, idempotent sweeper pass (Authorization: Bearer $CRON_SECRET).",
			Response: sweep.Result{}, Status: 200,
			Errors:  []string{apierr.CodeUnauthorized, apierr.CodeDatabaseUnavailable},
			Timeout: CronTimeout, Handle: s.cronSweep,
			Acts: true,
		},
		{
			Method: "POST", Pattern: "/api/cron/sweep", Name: "cron.sweep.post", Tag: "operations", Auth: AuthCron,
			Summary:  "Same as GET /api/cron/sweep.",
			Response: sweep.Result{}, Status: 200,
			Errors:  []string{apierr.CodeUnauthorized, apierr.CodeDatabaseUnavailable},
			Timeout: CronTimeout, Handle: s.cronSweep,
		},
	}
}

// listParams are a snake_case (effect gate) list's ?limit= and ?cursor=;
// camelListParams a camelCase (durable-job) list's (API.md §0).
var listParams, camelListParams = pageParams("next_cursor"), pageParams("nextCursor")

// pageParams are a list's ?limit= and ?cursor=, the cursor being what the
// page's cursorMember held.
func pageParams(cursorMember string) []Param {
	return []Param{
		{Name: "limit", Type: "integer", Description: "1-200, default 50: a page holds at most limit items and at " +
			"most about 4 MB of JSON, ending early (with its " + cursorMember + ", and always with one item) before an " +
			"item would pass that", Min: ptr(1), Max: ptr(200), Default: ptr(50)},
		{Name: "cursor", Type: "string", Description: "the previous page's " + cursorMember},
	}
}

func (s *Server) health(ctx context.Context, _ *Call) (any, error) {
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := s.Pool.Exec(ctx, "SELECT 1")
	if err != nil && db.IsUnavailable(err) && ctx.Err() == nil {
		// A pooled connection the server ended (a restart, a pooler's
		// recycling, pg_terminate_backend) fails once and leaves the pool:
		// a fresh one says whether the database itself is away (QA: health
		// flapped while the database answered).
		_, err = s.Pool.Exec(ctx, "SELECT 1")
	}
	if err != nil && errors.Is(context.Cause(caller), context.Canceled) {
		// The caller went away: not an outage, and no one hears the
		// answer (fail answers client_closed, unlogged). Soak QA: every
		// reader cut at the end of a run logged "database unavailable"
		// with "context canceled".
		return nil, err
	}
	if err != nil {
		failure := apierr.DatabaseUnavailable(nil)
		if db.IsPoolBusy(err) {
			// Still a 503 (this instance cannot serve now), but one that
			// says the database was never asked: its connections are all
			// in use, and an operator looks at the load, not the database
			// (pool QA: it read "database unavailable").
			failure = apierr.PoolBusy(nil)
			s.Logger.Warn("health: every pooled connection in use")
		} else {
			s.Logger.Warn("health: database unavailable", "err", err)
		}
		return Reply{Status: http.StatusServiceUnavailable, Body: map[string]any{
			"ok":    false,
			"error": failure.Wire(),
		}}, nil
	}
	return HealthResponse{OK: true}, nil
}

// signupTokenHeader carries SIGNUP_MODE=token's token.
const signupTokenHeader = "Ratchet-Signup-Token"

func (s *Server) signup(ctx context.Context, c *Call) (any, error) {
	gate := auth.SignupGate{Mode: s.Config.SignupMode, Token: s.Config.SignupBearer(), RatePerHour: s.Config.SignupRatePerHour}
	// A token sent twice is none, as two Authorization headers are (QA:
	// the first counted, so a valid one before an invalid one passed).
	var token string
	if sent := c.R.Header.Values(signupTokenHeader); len(sent) == 1 {
		token = sent[0]
	}
	if err := s.Auth.AdmitSignup(ctx, gate, token); err != nil {
		return nil, err
	}
	var req SignupRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	if err := auth.CheckWorkspaceName(req.Name); err != nil {
		return nil, err
	}
	if err := s.Auth.CheckSignupRate(ctx, gate); err != nil {
		return nil, err
	}
	ws, key, err := s.Auth.Signup(ctx, req.Name, s.signupSeeders()...)
	if err != nil {
		return nil, err
	}
	return SignupResponse{WorkspaceID: ws.ID, Name: ws.Name, Key: key}, nil
}

func (s *Server) createKey(ctx context.Context, c *Call) (any, error) {
	var req auth.CreateKeyRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Auth.CreateKey(ctx, c.Principal, req)
}

// createdByRule is what the key list's ?created_by= must be.
const createdByRule = "must be a key id (key_ and 26 characters)"

func (s *Server) listKeys(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	q := c.R.URL.Query()
	createdBy := q.Get("created_by")
	if q.Has("created_by") && !ids.Valid(ids.Key, createdBy) {
		// Given empty too: read as no filter, it would list every key
		// as the ones a compromised key minted, to be revoked.
		return nil, apierr.InvalidField("created_by", "%s", createdByRule)
	}
	keys, err := s.Auth.ListKeys(ctx, c.Principal.WorkspaceID, createdBy, cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, keys, limit, func(k auth.Key) string { return k.ID })
}

func (s *Server) revokeKey(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Key)
	if err != nil {
		return nil, err
	}
	withMinted, err := c.BoolParam("include_minted")
	if err != nil {
		return nil, err
	}
	if withMinted {
		return s.Auth.RevokeKeyTree(ctx, c.Principal, id)
	}
	return s.Auth.RevokeKey(ctx, c.Principal, id)
}

// cronSweep runs one pass. A pass that did nothing because the database
// could not be reached answers 503 with the envelope beside the result, so
// a scheduler or monitor that reads only the status sees the outage (QA:
// it answered 200); a pass with some failed tasks answers 200 and lists
// them in errors ("failed", or sweep.CutShort for one that ran out of its
// time after it changed rows).
func (s *Server) cronSweep(ctx context.Context, _ *Call) (any, error) {
	res := s.Sweeper.RunOnce(ctx)
	if res.Unreachable {
		return Reply{Status: http.StatusServiceUnavailable, Body: struct {
			sweep.Result
			Error apierr.Wire `json:"error"`
		}{res, apierr.DatabaseUnavailable(nil).Wire()}}, nil
	}
	return res, nil
}
