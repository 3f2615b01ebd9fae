package auth

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonstrict"
)

// A key's rate_limit_per_minute out of its bounds is told them in the
// words a number that is no integer is (lib/jsonstrict, from the field's
// openapi tags), as a policy's bounded integers are: 0 read
// "must be 1-1000000", 1.5 "must be an integer from 1 to 1000000".
func TestAKeysRateLimitBoundsAreWordedAsTheDecoders(t *testing.T) {
	t.Parallel()
	message := func(err error) string {
		t.Helper()
		e, ok := apierr.As(err)
		require.True(t, ok, "%v", err)
		problems, _ := e.Detail["validation"].([]apierr.FieldError)
		require.Len(t, problems, 1, "%v", e.Detail)
		require.Equal(t, "rate_limit_per_minute", problems[0].Field)
		return problems[0].Message
	}
	var req CreateKeyRequest
	decoded := jsonstrict.Decode([]byte(`{"name":"a","preset":"AGENT","rate_limit_per_minute":1.5}`), &req)
	for _, body := range []string{
		`{"name":"a","preset":"AGENT","rate_limit_per_minute":0}`,
		`{"name":"a","preset":"AGENT","rate_limit_per_minute":1000001}`,
	} {
		var req CreateKeyRequest
		require.NoError(t, jsonstrict.Decode([]byte(body), &req))
		_, _, err := req.resolve(&Principal{Scopes: AllScopes})
		require.Equal(t, message(decoded), message(err), body)
	}
}
