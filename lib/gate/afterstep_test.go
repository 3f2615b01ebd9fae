package gate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
)

// What follows a step's commit (its group settled after a resolve or an
// approval's decision) runs without the request's check (db.WithCheck,
// which has a call's transactions hold its key live): the step is made,
// and a key revoked since must not answer the request 401 as if nothing
// were done.
func TestWhatFollowsAStepsCommitIsNotChecked(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	refused := errors.New("refused")
	ctx := db.WithCheck(context.Background(), func(context.Context, pgx.Tx) error { return refused })
	group := ids.New(ids.Group)
	require.NoError(t, env.App.Server.Gate.AfterStep(ctx, "ws", &group))
}
