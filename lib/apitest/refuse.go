package apitest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Refuse makes the package database fail, with an error naming
// test_refuse, the row changes of event (a trigger's event and table, as
// "BEFORE DELETE ON effect_groups") of the rows when (a trigger's
// condition on OLD and NEW) holds of, until Refused's answer is called or
// the test ends: the failure a sweep task meets on every pass, such as a
// statement timeout over a large backlog, made to order. One at a time: a
// sweep acts on the whole package database, so a test using it is not
// parallel.
func Refuse(t testing.TB, event, when string) (allow func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, DatabaseURL(t))
	require.NoError(t, err)
	_, table, ok := strings.Cut(event, " ON ")
	require.True(t, ok, "event %q names no table", event)
	allow = func() {
		_, err := conn.Exec(ctx, `DROP TRIGGER IF EXISTS test_refuse ON `+table+`;
			DROP FUNCTION IF EXISTS test_refuse()`)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		allow()
		require.NoError(t, conn.Close(ctx))
	})
	_, err = conn.Exec(ctx, `
		CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    RAISE EXCEPTION 'test_refuse: the test refuses this change';
		END $$;
		CREATE TRIGGER test_refuse `+event+` FOR EACH ROW WHEN (`+when+`) EXECUTE FUNCTION test_refuse();`)
	require.NoError(t, err)
	return allow
}
