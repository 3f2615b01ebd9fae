package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
)

// A key's rate per minute is one count whichever instances its requests
// reach and whatever their clocks say: through an instance 90 s behind and
// one 90 s ahead, a key of 3 a minute is let through 3 times, not 3 times
// through each (clock QA: each instance counted in the minute its own
// clock read, two different windows).
func TestARateWindowIsOneWhateverTheInstancesClocksSay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	skewed := func(d time.Duration) *apitest.Env {
		return apitest.Start(t, apitest.WithWall(func() time.Time { return time.Now().Add(d) }))
	}
	behind, ahead := skewed(-90*time.Second), skewed(90*time.Second)
	ws := behind.Signup()
	minute := func() (m time.Time) {
		require.NoError(t, behind.App.Pool.QueryRow(ctx, `SELECT date_trunc('minute', clock_timestamp())`).Scan(&m))
		return m
	}
	// A window that rolls over while the requests are made lets more
	// through, rightly: try again (a few hundred milliseconds each).
	for try := 0; ; try++ {
		secret := behind.Key(ws, map[string]any{"name": "limited", "preset": "AGENT", "rate_limit_per_minute": 3})
		from := minute()
		let := 0
		for range 4 {
			for _, env := range []*apitest.Env{behind, ahead} {
				_, err := env.App.Server.Auth.Authenticate(ctx, secret)
				if err == nil {
					let++
					continue
				}
				e, ok := apierr.As(err)
				require.True(t, ok, "%v", err)
				require.Equal(t, apierr.CodeRateLimited, e.Code)
			}
		}
		if !minute().Equal(from) && try < 3 {
			continue
		}
		require.Equal(t, 3, let)
		return
	}
}
