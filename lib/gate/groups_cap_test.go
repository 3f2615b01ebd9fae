package gate_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// cappedStep is a new forward step of group g with a compensation.
func cappedStep(g string) map[string]any {
	return groupStep(g, email(key("capped-step")),
		map[string]any{"effect_type": "email.retract", "payload": map[string]any{"why": "undo"}})
}

// A group takes at most gate.MaxGroupSteps forward steps (3 here): a begin
// that would add another is refused 409 invalid_state naming the limit,
// and keeps nothing (its key is still free). A new attempt at a step, a
// replay, a commit and the compensations of the rollback are no new
// steps: a full group still works to its end.
func TestAFullGroupRefusesANewStepAndKeepsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gate.SetMaxGroupSteps(b.env.App.Server.Gate, 3)
	g := b.newGroup("g", "")
	bodies := []map[string]any{cappedStep(g), cappedStep(g), cappedStep(g)}
	for _, body := range bodies[:2] {
		d := b.mustBegin("execute", body)
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", nil).Status)
	}
	third := b.mustBegin("execute", bodies[2])
	require.Equal(t, http.StatusOK, b.report(str(third["effect_id"]), str(third["lease_token"]), "failed", nil).Status)

	extra := cappedStep(g)
	r := b.begin(extra)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	e := r.JSON()["error"].(map[string]any)
	require.Equal(t, apierr.CodeInvalidState, e["code"])
	require.Contains(t, e["message"], "holds 3 steps, the most one group takes; start a new group")
	require.Equal(t, map[string]any{"state": "open", "group_steps_max": float64(3)}, e["detail"])
	got := b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, b.ws.Key, nil).JSON()
	require.Len(t, got["steps"], 3, "the refused step is not in the group")
	other := b.newGroup("g", "")
	extra["group_id"] = other
	fresh := b.mustBegin("execute", extra)
	require.Equal(t, float64(1), fresh["attempt"], "its key kept nothing: it joins another group afresh")

	// The failed step's new attempt and a succeeded step's replay are not
	// new steps.
	again := b.mustBegin("execute", bodies[2])
	require.Equal(t, float64(2), again["attempt"])
	require.Equal(t, http.StatusOK, b.report(str(again["effect_id"]), str(again["lease_token"]), "succeeded", nil).Status)
	b.mustBegin("duplicate", bodies[0])

	// Committed, then unwound: its three compensations join it (six
	// effects), and the rollback ends.
	require.Equal(t, "committed", b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/commit", b.ws.Key, nil).JSON()["state"])
	u := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
	require.Len(t, u["plan"], 3)
	for _, it := range u["plan"].([]any) {
		item := it.(map[string]any)
		comp := item["compensation"].(map[string]any)
		d := b.mustBegin("execute", map[string]any{"effect_type": comp["effect_type"], "payload": comp["payload"],
			"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": item["effect_id"]})
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", nil).Status)
	}
	got = b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, b.ws.Key, nil).JSON()
	require.Equal(t, "unwound", got["state"])
	require.Len(t, got["steps"], 6)
}

// Begins racing for a group's last places fill it exactly: each one's
// count and commit take turns, so no two both find the last place free.
func TestBeginsRacingIntoAGroupFillItExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const max, racers = 3, 10
	gate.SetMaxGroupSteps(b.env.App.Server.Gate, max)
	for round := range 4 {
		g := b.newGroup("g", "")
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			statuses = map[int]int{}
		)
		start := make(chan struct{})
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, cappedStep(g))
				mu.Lock()
				defer mu.Unlock()
				statuses[r.Status]++
				if r.Status == http.StatusConflict {
					require.Equal(t, apierr.CodeInvalidState, r.JSON()["error"].(map[string]any)["code"], "%s", r.Body)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, map[int]int{http.StatusOK: max, http.StatusConflict: racers - max}, statuses, "round %d", round)
		got := b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, b.ws.Key, nil).JSON()
		require.Len(t, got["steps"], max, "round %d", round)
	}
}

// The published limit is gate.MaxGroupSteps, 10 000, and it keeps every
// answer that lists a group's steps whole within answer.Budget at its
// worst: an unwind's unresolved, irreversible and reversed ids (each step
// in one of them at most, here all in one) next to a plan item carrying a
// compensation of a whole request body (1 MiB), a refused commit naming
// every step, and a refused compensation naming every step unresolved
// (QA: near 70 000 steps each passed 4 MB).
func TestAFullGroupsAnswersFitTheBudget(t *testing.T) {
	t.Parallel()
	require.Equal(t, 10_000, gate.MaxGroupSteps)
	now := time.Now()
	stepIDs := make([]string, gate.MaxGroupSteps)
	pending := make([]map[string]string, gate.MaxGroupSteps)
	for i := range stepIDs {
		stepIDs[i] = ids.NewAt(ids.Effect, now)
		pending[i] = map[string]string{"effect_id": stepIDs[i], "state": gate.StateAwaitingApproval}
	}
	key, state := strings.Repeat("🙂", 255), gate.StateIndeterminate
	u := gate.Unwind{GroupID: ids.NewAt(ids.Group, now), State: gate.GroupUnwindFailed, Unresolved: stepIDs,
		Irreversible: []string{}, Reversed: []string{}, PlanTruncated: true,
		Plan: []gate.PlanItem{{EffectID: stepIDs[0], SuggestedIdempotencyKey: key, CompensatesEffectID: stepIDs[0],
			CompensationEffectID: &stepIDs[1], CompensationState: &state,
			Compensation: gate.Compensation{EffectType: strings.Repeat("t", gate.EffectTypeMaxLength),
				Payload: json.RawMessage(`"` + strings.Repeat(`\\`, (1<<20)/2) + `"`)}}}}
	unwind, err := jsonx.Marshal(u)
	require.NoError(t, err)
	envelope := func(e *apierr.Error) int {
		t.Helper()
		b, err := jsonx.Marshal(map[string]any{"error": e.Wire()})
		require.NoError(t, err)
		return len(b)
	}
	commit := envelope(apierr.InvalidState("A group commits only when every step succeeded.").WithDetail("steps", pending))
	compensation := envelope(apierr.InvalidState("The rollback has not reached this step.").WithDetail("unresolved", stepIDs))
	t.Logf("a full group: unwind %d bytes, refused commit %d, refused compensation %d", len(unwind), commit, compensation)
	for name, size := range map[string]int{"unwind": len(unwind), "commit": commit, "compensation": compensation} {
		require.Less(t, size, answer.Budget, name)
	}
	require.Less(t, len(unwind)-(1<<20), answer.Budget/8, "the lists take a small part of the budget")
	require.Less(t, commit, answer.Budget/4, fmt.Sprintf("%d steps named in a commit's refusal", gate.MaxGroupSteps))
}
