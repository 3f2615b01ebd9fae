package redact

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPreviewKeepsKeysAndHidesValues(t *testing.T) {
	t.Parallel()
	got := Preview([]byte(`{"email":"a@b.c","n":4,"ok":true,"tags":["x",1],"nested":{"card":"4242"},"z":null}`))
	b, _ := json.Marshal(got)
	require.JSONEq(t, `{"email":"<string>","n":"<number>","ok":"<boolean>","tags":["<string>","<number>"],
		"nested":{"card":"<string>"},"z":null}`, string(b))
	require.NotContains(t, string(b), "4242")
	require.Equal(t, "<string>", Preview([]byte(`"secret"`)))
	require.Nil(t, Preview(nil))
	require.Equal(t, "<invalid>", Preview([]byte(`{`)))
}
