package webhooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// patch sends PATCH /api/v1/webhooks/{id}.
func patch(env *apitest.Env, key, id string, body any) *apitest.Response {
	return env.Do("PATCH", "/api/v1/webhooks/"+id, key, body)
}

// sweepAt fans out and delivers what is due at the clock's time.
func sweepAt(t *testing.T, env *apitest.Env, clk *apitest.Clock) {
	t.Helper()
	ctx := context.Background()
	_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
}

// sentIDs are the event ids a receiver was sent, in order.
func sentIDs(t *testing.T, r *receiver) []string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, b := range r.bodies {
		var ev struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal(b, &ev))
		out = append(out, ev.ID)
	}
	return out
}

// eventOf is the id of the event recorded about subject.
func eventOf(t *testing.T, env *apitest.Env, subject string) string {
	t.Helper()
	var id string
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT id FROM events WHERE subject_id = $1`,
		subject).Scan(&id))
	return id
}

// A PATCH changes what it names and keeps the rest, answering the
// subscription as its reads show it; it is checked as a create is, and a
// deleted, unknown or other workspace's subscription is unknown to it.
func TestAnUpdateChangesWhatItNames(t *testing.T) {
	t.Parallel()
	env, clk := start(t, true)
	ws := env.Signup()
	id, secret := subscribe(t, env, ws.Key, "https://example.com/old")
	path := "/api/v1/webhooks/" + id
	created := env.Must(http.StatusOK, "GET", path, ws.Key, nil).JSON()
	require.Equal(t, false, created["disabled"])
	require.Nil(t, created["disabled_at"])

	got := env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"url": "https://example.com/new"}).JSON()
	require.Equal(t, "https://example.com/new", got["url"])
	require.Equal(t, created["events"], got["events"], "kept")
	require.Equal(t, got, env.Must(http.StatusOK, "GET", path, ws.Key, nil).JSON(), "answered as a read shows it")

	got = env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{
		"events": []string{events.StepExhausted, events.RunFinished, events.StepExhausted}}).JSON()
	require.Equal(t, []any{events.RunFinished, events.StepExhausted}, got["events"], "sorted, each once, as a create's")
	require.Equal(t, "https://example.com/new", got["url"], "kept")

	disabledAt := clk.Now().Truncate(time.Microsecond).Format(time.RFC3339Nano)
	got = env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"disabled": true}).JSON()
	require.Equal(t, true, got["disabled"])
	require.Equal(t, disabledAt, got["disabled_at"])
	listed := env.Must(http.StatusOK, "GET", "/api/v1/webhooks", ws.Key, nil).JSON()["data"].([]any)
	require.Equal(t, got, listed[0], "the list shows it disabled too")
	// Disabled again (a retry whose answer was lost): since the first time.
	clk.Add(time.Minute)
	require.Equal(t, got, env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"disabled": true}).JSON())
	got = env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"disabled": false}).JSON()
	require.Equal(t, false, got["disabled"])
	require.Nil(t, got["disabled_at"])
	require.Equal(t, got, env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"disabled": false}).JSON())
	require.NotContains(t, string(patch(env, ws.Key, id, map[string]any{"disabled": false}).Body), secret)

	// Checked as a create is, and nothing changed by a refused one.
	for name, c := range map[string]struct {
		body  any
		field string
	}{
		"empty body":    {"", "body"},
		"empty object":  {map[string]any{}, "body"},
		"null body":     {"null", "body"},
		"unknown field": {map[string]any{"disabled": true, "secret": "whsec_x"}, "secret"},
		"null url":      {map[string]any{"url": nil}, "url"},
		"null events":   {map[string]any{"events": nil}, "events"},
		"null disabled": {map[string]any{"disabled": nil}, "disabled"},
		"relative url":  {map[string]any{"url": "/hook"}, "url"},
		"spaced url":    {map[string]any{"url": "https://example.com/x "}, "url"},
		"port too high": {map[string]any{"url": "https://example.com:99999/x"}, "url"},
		"empty port":    {map[string]any{"url": "https://example.com:/x"}, "url"},
		"no events":     {map[string]any{"events": []string{}}, "events"},
		"unknown event": {map[string]any{"events": []string{"effect.exploded"}}, "events.0"},
		"not a bool":    {map[string]any{"disabled": "yes"}, "disabled"},
		"with a good one": {map[string]any{"disabled": true, "url": "ftp://example.com/x"},
			"url"},
	} {
		r := patch(env, ws.Key, id, c.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", name, r.Body)
		require.Equal(t, "invalid_request", r.ErrorCode(), name)
		require.Contains(t, string(r.Body), `"field":"`+c.field+`"`, name)
	}
	require.Equal(t, got, env.Must(http.StatusOK, "GET", path, ws.Key, nil).JSON(), "nothing changed")
	// A private address, unless the server allows them.
	strict, _ := start(t, false)
	sws := strict.Signup()
	sid, _ := subscribe(t, strict, sws.Key, "https://example.com/hook")
	r := patch(strict, sws.Key, sid, map[string]any{"url": "http://127.0.0.1:8080/hook"})
	require.Equal(t, http.StatusBadRequest, r.Status)
	require.Contains(t, string(r.Body), "must name a public address")

	// Scope, tenancy, unknown and deleted subscriptions.
	agent := env.Key(ws, map[string]any{"name": "a", "preset": "AGENT"})
	require.Equal(t, http.StatusForbidden, patch(env, agent, id, map[string]any{"disabled": true}).Status)
	other := env.Signup()
	require.Equal(t, http.StatusNotFound, patch(env, other.Key, id, map[string]any{"disabled": true}).Status)
	require.Equal(t, http.StatusNotFound, patch(env, ws.Key, ids.New(ids.Webhook), map[string]any{"disabled": true}).Status)
	require.Equal(t, http.StatusNotFound, patch(env, ws.Key, "whk_nope", map[string]any{"disabled": true}).Status)
	env.Must(http.StatusOK, "DELETE", path, ws.Key, nil)
	r = patch(env, ws.Key, id, map[string]any{"disabled": true})
	require.Equal(t, http.StatusNotFound, r.Status, "deleted: as to a rotation or a retry")
	require.Equal(t, "not_found", r.ErrorCode())
	require.Equal(t, http.StatusNotFound, env.Do("POST", path+"/rotate-secret", ws.Key, nil).Status)
}

// An update's bounds in the document are its handler's: the URL's length,
// no field null.
func TestUpdateTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	env, _ := start(t, false)
	ws := env.Signup()
	id, _ := subscribe(t, env, ws.Key, "https://example.com/hook")
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[webhooks.UpdateRequest](),
		Base: func(string) map[string]any { return map[string]any{"disabled": false} },
		Send: func(body map[string]any) *apitest.Response { return patch(env, ws.Key, id, body) },
		Text: func(_ string, n int) string {
			const base = "https://example.com/"
			return base + strings.Repeat("k", max(n-len(base), 0))
		},
	})
	require.GreaterOrEqual(t, checked, 5, "an update is tagged")
}

// A disabled subscription is sent nothing: the deliveries it had pending
// are held, their attempts untouched, and the events recorded while it is
// disabled are skipped, also when they are fanned out only once it is
// enabled again. Enabled again, the held deliveries are sent, and the
// events recorded from then on.
func TestADisabledWebhookHoldsItsDeliveriesAndSkipsItsEvents(t *testing.T) {
	env, clk := start(t, true)
	ws := env.Signup()
	rcv := newReceiver(t)
	id, _ := subscribe(t, env, ws.Key, rcv.URL)

	pending := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	_, err := env.App.Server.Webhooks.Dispatch(context.Background(), clk.Now())
	require.NoError(t, err)
	// Recorded before the subscription was disabled, fanned out after.
	clk.Add(time.Second)
	before := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	clk.Add(time.Second)
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": true})
	clk.Add(time.Second)
	skipped := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	for range 3 {
		sweepAt(t, env, clk)
		clk.Add(time.Hour)
	}
	require.Zero(t, rcv.count(), "nothing is sent while it is disabled")
	ds := deliveries(t, env, ws.Key, id)
	require.Len(t, ds, 2, "the events of before it was disabled, held; none of while it is")
	for _, d := range ds {
		require.Equal(t, "pending", d["state"])
		require.EqualValues(t, 0, d["attempts"], "held, its attempts untouched")
		require.Contains(t, []any{pending, before}, d["event_id"])
	}

	// Recorded while disabled, fanned out only once enabled again: skipped.
	late := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	clk.Add(time.Second)
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": false})
	after := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	sweepAt(t, env, clk)
	require.ElementsMatch(t, []string{pending, before, after}, sentIDs(t, rcv))
	for _, d := range deliveries(t, env, ws.Key, id) {
		require.Equal(t, "delivered", d["state"])
		require.EqualValues(t, 1, d["attempts"])
		require.NotContains(t, []any{skipped, late}, d["event_id"])
	}
	sweepAt(t, env, clk)
	require.Equal(t, 3, rcv.count(), "the skipped events are never sent")
}

// A new url applies to the deliveries not yet sent, and new events to what
// is fanned out from then on: pending deliveries of a type no longer
// listed end failed, and are not sent.
func TestAnUpdateAppliesToWhatIsNotSentYet(t *testing.T) {
	env, clk := start(t, true)
	ws := env.Signup()
	down := newReceiver(t, http.StatusServiceUnavailable)
	moved := newReceiver(t)
	r := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key, map[string]any{"url": down.URL,
		"events": []string{events.RunFinished, events.StepExhausted}}).JSON()
	id := r["id"].(string)
	finished := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	sweepAt(t, env, clk)
	require.Equal(t, 1, down.count())
	exhausted := eventOf(t, env, record(t, env, ws.ID, events.StepExhausted, clk.Now()))
	_, err := env.App.Server.Webhooks.Dispatch(context.Background(), clk.Now())
	require.NoError(t, err)

	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"url": moved.URL,
		"events": []string{events.RunFinished, events.CircuitTripped}})
	byEvent := map[any]map[string]any{}
	for _, d := range deliveries(t, env, ws.Key, id) {
		byEvent[d["event_id"]] = d
	}
	require.Equal(t, "failed", byEvent[exhausted]["state"], "its type is no longer listed")
	require.Equal(t, "event type unsubscribed", byEvent[exhausted]["last_error"])
	require.Equal(t, "pending", byEvent[finished]["state"])
	record(t, env, ws.ID, events.StepExhausted, clk.Now())
	tripped := eventOf(t, env, record(t, env, ws.ID, events.CircuitTripped, clk.Now()))
	clk.Add(2 * time.Minute) // past the failed attempt's backoff
	sweepAt(t, env, clk)
	require.Equal(t, 1, down.count(), "nothing more to the old url")
	require.ElementsMatch(t, []string{finished, tripped}, sentIDs(t, moved))
	require.Len(t, deliveries(t, env, ws.Key, id), 3, "no delivery of a type no longer listed")
}

// A PATCH racing a send (the main case: a send in flight when it commits)
// neither waits for the send nor is undone by it: the send claimed before
// the change goes to the old url, and its outcome is recorded; the next
// attempt goes to the new url. A subscription disabled meanwhile holds the
// failed send's next attempt until it is enabled.
func TestAnUpdateRacingASendAppliesFromTheNextClaim(t *testing.T) {
	for _, change := range []string{"url", "disabled"} {
		t.Run(change, func(t *testing.T) {
			env, clk := start(t, true)
			ws := env.Signup()
			old, arrived, oldHits, release := newHeldReceiver(t, http.StatusInternalServerError)
			moved := newReceiver(t)
			id, _ := subscribe(t, env, ws.Key, old.URL)
			ev := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
			_, err := env.App.Server.Webhooks.Dispatch(context.Background(), clk.Now())
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				_, err := env.App.Server.Webhooks.Deliver(context.Background(), clk.Now())
				done <- err
			}()
			<-arrived
			// Answered while the send is still in flight.
			body := map[string]any{"url": moved.URL}
			if change == "disabled" {
				body = map[string]any{"disabled": true}
			}
			updated := env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, body).JSON()
			release()
			require.NoError(t, <-done)
			ds := deliveries(t, env, ws.Key, id)
			require.Len(t, ds, 1)
			require.Equal(t, "pending", ds[0]["state"], "the send's failure recorded")
			require.EqualValues(t, 500, ds[0]["last_status_code"])
			require.Equal(t, updated, env.Must(http.StatusOK, "GET", "/api/v1/webhooks/"+id, ws.Key, nil).JSON(),
				"the send's record left the change as it was")

			clk.Add(2 * time.Minute) // past its backoff
			sweepAt(t, env, clk)
			if change == "disabled" {
				require.Zero(t, moved.count())
				require.EqualValues(t, 1, deliveries(t, env, ws.Key, id)[0]["attempts"], "held while disabled")
				env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key,
					map[string]any{"disabled": false, "url": moved.URL})
				sweepAt(t, env, clk)
			}
			require.EqualValues(t, 1, oldHits.Load(), "the old url was sent only the send claimed before")
			require.Equal(t, []string{ev}, sentIDs(t, moved))
			ds = deliveries(t, env, ws.Key, id)
			require.Equal(t, "delivered", ds[0]["state"])
			require.EqualValues(t, 2, ds[0]["attempts"])
		})
	}
}

// A disabled webhook's deliveries are held by its being disabled: one whose
// secret is sealed under a key this instance lacks is not logged each pass
// as held for the key (the operator could do nothing about it).
func TestADisabledWebhookIsNotLoggedAsHeldForItsKey(t *testing.T) {
	var logs apitest.LockedBuffer
	env, clk := start(t, true, apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := context.Background()
	ws := env.Signup()
	id, secret := subscribe(t, env, ws.Key, "https://example.com/hook")
	lost, err := seal.New(bytes.Repeat([]byte{4}, 32))
	require.NoError(t, err)
	_, err = env.App.Pool.Exec(ctx, `UPDATE webhooks SET secret = $2 WHERE id = $1`, id,
		lost.Seal([]byte(secret), seal.AAD(id, "secret")))
	require.NoError(t, err)
	record(t, env, ws.ID, events.RunFinished, clk.Now())
	_, err = env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": true})
	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
	require.NotContains(t, logs.String(), "webhook deliveries held")
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": false})
	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
	require.Contains(t, logs.String(), "webhook deliveries held", "enabled, it is held for its key again")
}

// A disable that waits for an enable holding the subscription's row is
// disabled from after that enable, not from before it: its clock is read
// once it holds the row. Read before (the update's first act, before its
// transaction began), a disable whose clock read 12:00:00 and that then
// waited while an enable committed at 12:00:01 recorded disabled_at
// 12:00:00, before the enable, and the events recorded in between, while
// the subscription was enabled, were skipped as recorded while disabled,
// never sent (review). The enable runs in a request's transaction
// (db.BeginRequest) that has locked the row first, so the disable is seen
// waiting before the enable reads its clock; an event committed with the
// enable stands for one recorded while it is enabled.
func TestADisableWaitingForAnEnableSkipsOnlyTheEventsAfterIt(t *testing.T) {
	env, clk := start(t, true)
	ws := env.Signup()
	rcv := newReceiver(t)
	id, _ := subscribe(t, env, ws.Key, rcv.URL)
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": true})
	clk.Add(time.Hour)

	ctx := context.Background()
	hooks, pool := env.App.Server.Webhooks, env.App.Pool
	reqCtx, enable := db.BeginRequest(ctx, pool)
	defer func() { _ = enable.Rollback(context.Background()) }()
	var pid int
	require.NoError(t, enable.QueryRow(reqCtx, `SELECT pg_backend_pid() FROM webhooks WHERE id = $1
		FOR NO KEY UPDATE`, id).Scan(&pid))
	waits := apitest.NewLockWaits(t, pool, pid)

	var (
		disabled   webhooks.Webhook
		disableErr error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		disabled, disableErr = hooks.Update(ctx, ws.ID, id,
			webhooks.UpdateRequest{Disabled: jsonx.Optional[bool]{Set: true, Value: true}})
	}()
	waits.Waiting(done, "the disable waits for the enable's hold on the webhook's row")

	clk.Add(time.Second)
	enabledAt := clk.Now()
	_, err := hooks.Update(reqCtx, ws.ID, id, webhooks.UpdateRequest{Disabled: jsonx.Optional[bool]{Set: true}})
	require.NoError(t, err)
	subject := ids.New(ids.Effect)
	require.NoError(t, events.Record(reqCtx, enable, events.Event{WorkspaceID: ws.ID, Type: events.RunFinished,
		SubjectID: subject, Data: map[string]any{"effect_id": subject}, At: enabledAt}))
	clk.Add(time.Second)
	require.NoError(t, enable.Commit(ctx))
	<-done
	require.NoError(t, disableErr)

	require.True(t, disabled.Disabled)
	require.NotNil(t, disabled.DisabledAt)
	require.False(t, disabled.DisabledAt.Before(enabledAt), "disabled at %v, before the enable at %v it waited for",
		*disabled.DisabledAt, enabledAt)
	_, err = hooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	ds := deliveries(t, env, ws.Key, id)
	require.Len(t, ds, 1, "the event recorded while it was enabled is fanned out, held")
	require.Equal(t, eventOf(t, env, subject), ds[0]["event_id"])
	require.Equal(t, "pending", ds[0]["state"])
}
