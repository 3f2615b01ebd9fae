package app_test

import (
	"net/url"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/db"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// A serverless instance whose first start met the database down (it
// migrates at start) starts at the next invocation once the database is
// back: the failure is not kept for the instance's life.
func TestDefaultStartsAgainAfterAFailedStart(t *testing.T) {
	cfg := apitest.Config(t)
	t.Setenv("RESULT_ENCRYPTION_KEY", cfg.ResultEncryptionKey)
	t.Setenv("KEY_HASH_SECRET", cfg.KeyHashSecret)
	t.Setenv("AUTO_MIGRATE", "true")
	down, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	down.Host = "127.0.0.1:1" // nothing listens there
	t.Setenv("DATABASE_URL", down.String())

	_, err = app.Default()
	require.Error(t, err)
	require.True(t, db.IsUnavailable(err), "an outage, not a configuration error: %v", err)

	// For a few seconds the failure answers for itself (requests during an
	// outage fail at once), then the next call builds again.
	t.Setenv("DATABASE_URL", cfg.DatabaseURL)
	_, again := app.Default()
	require.Equal(t, err, again)
	app.ForgetFailedStart()
	a, err := app.Default()
	require.NoError(t, err)
	same, err := app.Default()
	require.NoError(t, err)
	require.Same(t, a, same, "built once, then reused")
}
