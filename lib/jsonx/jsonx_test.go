package jsonx

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

type body struct {
	N Optional[int64] `json:"n"`
}

func TestOptionalDistinguishesOmittedNullAndValue(t *testing.T) {
	t.Parallel()
	var omitted, null, value body
	require.NoError(t, json.Unmarshal([]byte(`{}`), &omitted))
	require.NoError(t, json.Unmarshal([]byte(`{"n":null}`), &null))
	require.NoError(t, json.Unmarshal([]byte(`{"n":7}`), &value))

	stored := int64(3)
	dst := &stored
	omitted.N.Apply(&dst)
	require.Equal(t, int64(3), *dst, "omitted keeps")
	value.N.Apply(&dst)
	require.Equal(t, int64(7), *dst, "a value sets")
	null.N.Apply(&dst)
	require.Nil(t, dst, "null clears")

	require.Nil(t, omitted.N.Ptr())
	require.Nil(t, null.N.Ptr())
	require.Equal(t, int64(7), *value.N.Ptr())
}

func TestOptionalRejectsWrongType(t *testing.T) {
	t.Parallel()
	var b body
	require.Error(t, json.Unmarshal([]byte(`{"n":"x"}`), &b))
}

func TestMarshalWritesMarkupAsIs(t *testing.T) {
	b, err := Marshal(map[string]any{"html": "<a href='x'>&</a>"})
	require.NoError(t, err)
	require.Equal(t, `{"html":"<a href='x'>&</a>"}`, string(b), "unescaped, with no trailing newline")
}
