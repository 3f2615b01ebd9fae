package httpapi_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// apiScopes is API.md §1's scope list, as written there.
var apiScopes = []string{"effects:begin", "effects:report", "effects:read", "effects:resolve",
	"policies:read", "policies:write", "approvals:write", "keys:write", "runs:write", "runs:read", "jobs:work",
	"steps:replay", "endpoints:write", "contracts:write", "webhooks:write", "reconcile:write", "billing:write"}

// API.md §1 over HTTP: signup's operator key and an OPERATOR preset hold
// every scope of §1 and no other; AGENT, INGEST and WORKER hold exactly
// theirs; a key minted with scopes holds those; the secret is answered once
// and stored only as HMAC-SHA-256 under KEY_HASH_SECRET, nowhere in clear.
// (TestScopeMatrix pins what each preset may call, never what it reads.)
func TestConformanceKeyPresetsAndSecrets(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	signup := env.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "acme"}).JSON()
	require.ElementsMatch(t, []string{"workspace_id", "name", "key"}, keysOf(signup))
	opKey := signup["key"].(map[string]any)
	requireFields(t, "signup key", opKey, "id", "secret", "scopes")
	require.ElementsMatch(t, apiScopes, opKey["scopes"])
	op := opKey["secret"].(string)

	for preset, want := range map[string][]string{
		"OPERATOR": apiScopes,
		"AGENT":    {"effects:begin", "effects:report"},
		"INGEST":   {"runs:write", "runs:read"},
		"WORKER":   {"jobs:work"},
	} {
		body := map[string]any{"name": preset, "preset": preset}
		if preset == "WORKER" {
			body["tools"] = []string{"send_welcome_email@1"}
		}
		k := env.Must(http.StatusCreated, "POST", "/api/v1/keys", op, body).JSON()
		require.ElementsMatch(t, want, k["scopes"], preset)
		read := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", k["secret"].(string), nil).JSON()
		require.ElementsMatch(t, want, read["scopes"], preset)
		require.NotContains(t, read, "secret", preset)
	}
	k := env.Must(http.StatusCreated, "POST", "/api/v1/keys", op, map[string]any{"name": "reader",
		"scopes": []string{"effects:read", "policies:read"}, "daily_spend_ceiling_micros": nil, "rate_limit_per_minute": nil}).JSON()
	require.ElementsMatch(t, []string{"effects:read", "policies:read"}, k["scopes"])

	secret := k["secret"].(string)
	var stored []byte
	var clear bool
	require.NoError(t, env.App.Pool.QueryRow(t.Context(),
		`SELECT secret_hash, strpos(row_to_json(k)::text, $2) > 0 FROM api_keys k WHERE id = $1`,
		k["id"], secret).Scan(&stored, &clear))
	m := hmac.New(sha256.New, []byte(env.App.Server.Config.KeyHashSecret))
	m.Write([]byte(secret))
	require.Equal(t, m.Sum(nil), stored, "HMAC-SHA-256 of the secret under KEY_HASH_SECRET")
	require.False(t, clear, "the secret is stored nowhere in clear")
	for _, listed := range env.Must(http.StatusOK, "GET", "/api/v1/keys", op, nil).JSON()["data"].([]any) {
		require.NotContains(t, listed, "secret")
	}
}
