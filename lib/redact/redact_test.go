package redact

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPreviewKeepsKeysAndHidesValues(t *testing.T) {
	t.Parallel()
	got := PreviewJSON([]byte(`{"to":"alice@example.com","amount":12.5,"ok":true,"n":null,
		"tags":["a","b"],"addr":{"street":"1 Main","zip":12345}}`))
	require.JSONEq(t, `{"to":"<string>","amount":"<number>","ok":"<boolean>","n":null,
		"tags":"<array>","addr":{"street":"<string>","zip":"<number>"}}`, string(got))
	require.NotContains(t, string(got), "alice")
	require.NotContains(t, string(got), "12345")
}

func TestPreviewScalarsAndInvalid(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"<string>"`, string(PreviewJSON([]byte(`"secret"`))))
	require.Equal(t, `"<array>"`, string(PreviewJSON([]byte(`[1,{"a":2}]`))))
	require.Equal(t, `null`, string(PreviewJSON(nil)))
	require.Equal(t, `null`, string(PreviewJSON([]byte(`{"a":`))))
}

func TestPreviewBoundsDepthAndKeys(t *testing.T) {
	t.Parallel()
	got := PreviewJSON([]byte(`{"a":{"b":{"c":{"d":{"e":"x"}}}}}`))
	require.JSONEq(t, `{"a":{"b":{"c":{"d":"<object>"}}}}`, string(got))

	var sb strings.Builder
	sb.WriteString("{")
	for i := 0; i < MaxKeys+3; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `"k%03d":%d`, i, i)
	}
	sb.WriteString("}")
	got = PreviewJSON([]byte(sb.String()))
	require.Contains(t, string(got), `"<3 more keys>"`)
	require.NotContains(t, string(got), `"k050"`)
}
