package gate_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// skewed is an instance's wall clock running d off the database's.
func skewed(d time.Duration) apitest.Option {
	return apitest.WithWall(func() time.Time { return time.Now().Add(d) })
}

// A lease granted through an instance whose clock runs 90 s behind holds
// for its 60 s through one whose clock runs 90 s ahead: the key is not
// granted again there, the effect does not read indeterminate, that
// instance's sweeper does not lapse it, and the holder's report lands
// (clock QA: each instance decided by its own clock, so the second saw the
// lease lapsed at once and answered blocked, and its sweeper recorded the
// attempt indeterminate while its holder still acted).
//
// Not parallel: the sweeper acts on every workspace of the package
// database at the database's time, where the other tests' clocks stand
// elsewhere.
func TestALeaseHoldsWhateverTheInstancesClocksSay(t *testing.T) {
	behind, ahead := apitest.Start(t, skewed(-90*time.Second)), apitest.Start(t, skewed(90*time.Second))
	ws := behind.Signup()
	k := key("skew")
	d := behind.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, email(k)).JSON()
	require.Equal(t, "execute", d["decision"])
	id, token := str(d["effect_id"]), str(d["lease_token"])
	exp, err := time.Parse(time.RFC3339Nano, str(d["lease_expires_at"]))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(60*time.Second), exp, 5*time.Second, "the database's time, not the instance's")

	require.NoError(t, ahead.App.Sweeper.RunOnce(context.Background()).Error())
	require.Equal(t, "leased", behind.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, ws.Key, nil).JSON()["state"],
		"the sweeper ahead lapsed nothing")
	again := ahead.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, email(k)).JSON()
	require.Equal(t, "in_flight", again["decision"], "%v", again)
	require.Equal(t, "leased", ahead.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, ws.Key, nil).JSON()["state"])

	hb := ahead.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/heartbeat", ws.Key,
		map[string]any{"lease_token": token}).JSON()
	extended, err := time.Parse(time.RFC3339Nano, str(hb["lease_expires_at"]))
	require.NoError(t, err)
	require.WithinDuration(t, exp, extended, 5*time.Second, "a heartbeat through the instance ahead adds no 90 s")

	r := ahead.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report", ws.Key,
		map[string]any{"lease_token": token, "outcome": "succeeded"}).JSON()
	require.Equal(t, "succeeded", r["state"])
}
