package apitest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/db"
)

// Mark is what every user-controlled value of a log-leak test carries
// (lib/sdktest's TestNothingUserControlledIsLogged and its siblings, the
// functions' own): no log line may hold it, in any case.
const Mark = "zqleak"

// Marked is a fresh marked value: Mark, label and n.
func Marked(label string, n int) string { return fmt.Sprintf("%s_%s_%d", Mark, label, n) }

// RequireNoLeak fails when logs hold Mark (in any case) or any of secrets,
// whole or either half (a lease token's id or its secret part alone), and
// when logs lack one of the lines required (else the test holds nothing:
// the path it meant to log never ran).
func RequireNoLeak(t testing.TB, logs string, secrets []string, required ...string) {
	t.Helper()
	require.NotEmpty(t, logs, "something is logged (else the test holds nothing)")
	if i := strings.Index(strings.ToLower(logs), Mark); i >= 0 {
		start := strings.LastIndexByte(logs[:i], '\n') + 1
		end := strings.IndexByte(logs[i:], '\n')
		if end < 0 {
			end = len(logs) - i
		}
		t.Fatalf("a log line holds a marked value:\n%s", logs[start:i+end])
	}
	for _, secret := range secrets {
		require.NotContains(t, logs, secret)
		half := len(secret) / 2
		require.NotContains(t, logs, secret[:half], "the first half of a secret")
		require.NotContains(t, logs, secret[half:], "the second half of a secret")
	}
	for _, line := range required {
		if !strings.Contains(logs, line) {
			t.Fatalf("no log line holds %q: the path the test needs was not logged", line)
		}
	}
}

// PanickyBody is a request body whose Read panics with V: how a test makes
// a route's handler panic mid-request, as a bug reading the request's data
// would, with no hook in the product (the handler must be called in
// process: a server reads a body off the wire).
type PanickyBody struct{ V any }

func (b PanickyBody) Read([]byte) (int, error) { panic(b.V) }

// Close implements io.Closer.
func (PanickyBody) Close() error { return nil }

// refuseSQL has Postgres refuse a marked value with an error whose message
// quotes it, raised within a route's (or a sweep task's) own statement: a
// trigger put on a table (RefuseMarked) casts the value to an integer (a
// data exception, 22P02 `invalid input syntax for type integer: "…"`), or
// raises an exception naming it, as a migration's RAISE names what it was
// given (jobs_enqueue's `contract % of % not found`, its tool's name),
// under P0001 or a code of its own. Which one is in the value: castme,
// raiseme or coded. TG_ARGV[0] is the column read; TG_ARGV[1], when set,
// a webhook_id column whose webhook's URL is read instead.
const refuseSQL = `
CREATE OR REPLACE FUNCTION logleak_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    IF TG_NARGS > 1 THEN
        SELECT url INTO v FROM webhooks WHERE id = v;
    END IF;
    IF v LIKE '%castme%' THEN
        PERFORM v::int;
    ELSIF v LIKE '%raiseme%' THEN
        RAISE EXCEPTION 'refused: %', v;
    ELSIF v LIKE '%coded%' THEN
        RAISE EXCEPTION 'refused: %', v USING ERRCODE = 'RTZ99';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER logleak_effects BEFORE INSERT ON effects FOR EACH ROW EXECUTE FUNCTION logleak_refuse('idempotency_key');
CREATE TRIGGER logleak_groups BEFORE INSERT ON effect_groups FOR EACH ROW EXECUTE FUNCTION logleak_refuse('name');
CREATE TRIGGER logleak_deliveries BEFORE UPDATE ON webhook_deliveries FOR EACH ROW
    EXECUTE FUNCTION logleak_refuse('webhook_id', 'url');
`

const unrefuseSQL = `
DROP TRIGGER IF EXISTS logleak_effects ON effects;
DROP TRIGGER IF EXISTS logleak_groups ON effect_groups;
DROP TRIGGER IF EXISTS logleak_deliveries ON webhook_deliveries;
DROP FUNCTION IF EXISTS logleak_refuse();
`

// RefuseMarked installs refuseSQL on the database q reaches until the test
// ends. Only one test of a package may hold it at a time (not parallel).
func RefuseMarked(t testing.TB, q db.Querier) {
	t.Helper()
	ctx := context.Background()
	_, err := q.Exec(ctx, refuseSQL)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := q.Exec(ctx, unrefuseSQL)
		require.NoError(t, err)
	})
}
