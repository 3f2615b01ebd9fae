package canonjson

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMarshalSortsKeysKeepsArrays(t *testing.T) {
	t.Parallel()
	got, err := Marshal(json.RawMessage(`{"b": [3, 1, {"z":1,"a":2}], "a": "x", "n": 1.0}`))
	require.NoError(t, err)
	require.Equal(t, `{"a":"x","b":[3,1,{"a":2,"z":1}],"n":1}`, string(got))
}

func TestHashIgnoresKeyOrderButNotArrayOrder(t *testing.T) {
	t.Parallel()
	h1, err := Hash(json.RawMessage(`{"a":1,"b":2}`))
	require.NoError(t, err)
	h2, err := Hash(json.RawMessage(`{"b":2,"a":1}`))
	require.NoError(t, err)
	h3, err := Hash(json.RawMessage(`{"a":[1,2]}`))
	require.NoError(t, err)
	h4, err := Hash(json.RawMessage(`{"a":[2,1]}`))
	require.NoError(t, err)
	require.Equal(t, h1, h2)
	require.NotEqual(t, h3, h4)
}

func TestLargeIntegersStayExact(t *testing.T) {
	t.Parallel()
	got, err := Marshal(json.RawMessage(`{"n": 9007199254740993}`))
	require.NoError(t, err)
	require.Equal(t, `{"n":9007199254740993}`, string(got))
}
