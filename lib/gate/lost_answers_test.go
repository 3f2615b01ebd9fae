package gate_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Lost-answer retries of the gate's write routes after other things
// happened meanwhile (retry QA): each repeat is answered as its first
// request was, and changes nothing.

// A report that landed just before its lease's end, repeated after the
// lease ended and another caller's begin read the effect a duplicate,
// answers the same effect: the lapse does not turn the repeat into
// lease_expired (which would tell a worker its success was not recorded).
// Its heartbeat's repeat says the attempt was reported.
func TestAReportRepeatedAfterItsLeaseEndedAnswersTheSame(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("lost-report")
	d := b.mustBegin("execute", email(k))
	id, token := str(d["effect_id"]), str(d["lease_token"])
	b.clock.Add(59 * time.Second)
	first := b.report(id, token, "succeeded", map[string]any{"m": "1"})
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	b.clock.Add(5 * time.Minute)
	b.mustBegin("duplicate", email(k))
	again := b.report(id, token, "succeeded", map[string]any{"m": "1"})
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, first.JSON(), again.JSON())
	errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token}),
		http.StatusConflict, "invalid_state")
	require.Equal(t, first.JSON(), b.get(id))
}

// An approval repeated after its effect ran (and failed) answers the
// approval unchanged; the other decision is refused, naming the state.
func TestAnApprovalRepeatedAfterItsEffectRanAnswersTheSame(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000})
	k := key("lost-approve")
	aid := str(b.mustBegin("approval_required", wire(k))["approval_id"])
	first := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/approve", b.ws.Key,
		map[string]any{"note": "ok"}).JSON()
	ex := b.mustBegin("execute", wire(k))
	require.Equal(t, http.StatusOK, b.report(str(ex["effect_id"]), str(ex["lease_token"]), "failed", nil).Status)
	again := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/approve", b.ws.Key,
		map[string]any{"note": "ok"}).JSON()
	require.Equal(t, first, again)
	require.Equal(t, map[string]any{"state": "approved"}, errCode(t,
		b.env.Do("POST", "/api/v1/approvals/"+aid+"/reject", b.ws.Key, nil), http.StatusConflict, "invalid_state")["detail"])
	require.EqualValues(t, 2, b.mustBegin("execute", wire(k))["attempt"], "the failed attempt frees the key")
}

// A policy PUT without expected_version repeated answers the same policy
// at the same version (README: retry-safe); one with expected_version finds
// its own write and answers version_conflict naming the current version.
func TestAPolicyPutRepeatedKeepsItsVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.putPolicy("lost.put", map[string]any{"max_attempts": 3})
	require.Equal(t, first, b.putPolicy("lost.put", map[string]any{"max_attempts": 3}))
	body := map[string]any{"max_attempts": 4, "expected_version": first["version"]}
	second := b.env.Must(http.StatusOK, "PUT", "/api/v1/policies/lost.put", b.ws.Key, body).JSON()
	require.Equal(t, map[string]any{"current_version": second["version"]}, errCode(t,
		b.env.Do("PUT", "/api/v1/policies/lost.put", b.ws.Key, body), http.StatusConflict, "version_conflict")["detail"])
}
