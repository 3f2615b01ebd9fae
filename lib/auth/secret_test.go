package auth

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/ids"
)

func TestParseSecret(t *testing.T) {
	t.Parallel()
	id := ids.New(ids.Key)
	secret := secretPrefix + strings.TrimPrefix(id, "key_") + "_" + ids.Random(32)
	require.Equal(t, ids.Len(ids.Key), keyIDLen)
	got, ok := parseSecret(secret)
	require.True(t, ok)
	require.Equal(t, id, got)

	for _, bad := range []string{"", "rk_", "rk_x_y", secret[:len(secret)-1], "xx" + secret[2:], strings.Replace(secret, "rk_", "rk_!", 1)} {
		_, ok := parseSecret(bad)
		require.False(t, ok, bad)
	}
}

func TestPrincipalToolRules(t *testing.T) {
	t.Parallel()
	operator := &Principal{Scopes: AllScopes}
	require.True(t, operator.MayWorkTool("send", "1"), "jobs:work without a tools list works any tool")
	worker := &Principal{Scopes: []string{ScopeJobsWork}, Tools: []string{"send@1"}}
	require.True(t, worker.MayWorkTool("send", "1"))
	require.False(t, worker.MayWorkTool("send", "2"))
	err := worker.RequireTools([2]string{"send", "1"}, [2]string{"charge", "3"})
	require.Error(t, err)
	require.Contains(t, err.Error(), "forbidden")
	agent := &Principal{Scopes: Presets["AGENT"]}
	require.False(t, agent.MayWorkTool("send", "1"))
}

// The OpenAPI document's lists of scopes and presets are the struct tags of
// CreateKeyRequest: they must name exactly the scopes and presets there are.
func TestCreateKeyRequestTagsListEveryScopeAndPreset(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[CreateKeyRequest]()
	listed := func(field, option string) []string {
		f, ok := typ.FieldByName(field)
		require.True(t, ok, field)
		for _, part := range strings.Split(f.Tag.Get("openapi"), ",") {
			if v, ok := strings.CutPrefix(part, option+"="); ok {
				return strings.Split(v, "|")
			}
		}
		t.Fatalf("%s has no %s in its openapi tag", field, option)
		return nil
	}
	require.Equal(t, AllScopes, listed("Scopes", "itemEnum"))
	require.ElementsMatch(t, slices.Collect(maps.Keys(Presets)), listed("Preset", "enum"))
}

// SharedSecretEqual is equality, whatever the two lengths (what it hides,
// the time, no test here measures).
func TestSharedSecretEqual(t *testing.T) {
	t.Parallel()
	require.True(t, SharedSecretEqual("let-me-in", "let-me-in"))
	for _, sent := range []string{"", "let-me-i", "let-me-in!", "LET-ME-IN", "let-me-in "} {
		require.False(t, SharedSecretEqual(sent, "let-me-in"), "%q", sent)
	}
}
