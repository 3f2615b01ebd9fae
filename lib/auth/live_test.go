package auth_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
)

// A key check that cannot reach the database answers an error of its own:
// neither "live", which would let a revoked key act, nor "revoked", which
// would answer a valid caller 401 for an outage (the route's error path
// then answers it as the database's failure).
func TestAKeyCheckThatFailsIsNeitherLiveNorRevoked(t *testing.T) {
	env := apitest.Start(t)
	ws := env.Signup()
	ctx := context.Background()
	p, err := env.App.Server.Auth.Authenticate(ctx, ws.Key)
	require.NoError(t, err)

	revoked, err := auth.KeyRevoked(ctx, env.App.Pool, p.KeyID)
	require.NoError(t, err)
	require.False(t, revoked, "the workspace's own key is live")

	gone, cancel := context.WithCancel(ctx)
	cancel()
	revoked, err = auth.KeyRevoked(gone, env.App.Pool, p.KeyID)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "check key")
	require.False(t, revoked)
	requireNotAnAnswer(t, err)

	tx, err := env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, auth.RequireLive(ctx, tx, p.KeyID), "the key is live inside a healthy transaction")
	_, err = tx.Exec(ctx, `SELECT 1 / 0`) // the transaction is aborted from here on
	require.Error(t, err)
	err = auth.RequireLive(ctx, tx, p.KeyID)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25P02", pgErr.Code, "in_failed_sql_transaction")
	require.ErrorContains(t, err, "check key")
	requireNotAnAnswer(t, err)
}

// requireNotAnAnswer fails when err is one of the API's own answers (such as
// 401 unauthorized) rather than a failure for the route to report.
func requireNotAnAnswer(t *testing.T, err error) {
	t.Helper()
	var answer *apierr.Error
	require.False(t, errors.As(err, &answer), "a database failure was answered as %v", answer)
}
