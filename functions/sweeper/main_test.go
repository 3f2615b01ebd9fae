package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/sweep"
)

func TestMain(m *testing.M) { os.Exit(apitest.FunctionMain(m, main)) }

// The deployed sweeper, its real main and lambda.Start included, runs a pass
// for each scheduled event Lambda's Runtime API hands it, and answers what
// each task changed: here the previous signing secret of a webhook, expired.
func TestTheLambdaFunctionSweepsOnEachScheduledEvent(t *testing.T) {
	env := apitest.Start(t)
	ws := env.Signup()
	id := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}}).JSON()["id"].(string)
	env.Must(http.StatusOK, "POST", "/api/v1/webhooks/"+id+"/rotate-secret", ws.Key, nil)
	_, err := env.App.Pool.Exec(context.Background(),
		`UPDATE webhooks SET previous_secret_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)

	rt := apitest.NewLambdaRuntime(t)
	rt.StartFunction(t)
	scheduled := events.EventBridgeEvent{Version: "0", ID: "e1", DetailType: "Scheduled Event", Source: "aws.events",
		Region: "us-east-1", Time: time.Now().UTC(), Detail: json.RawMessage(`{}`)}
	pass := func() sweep.Result {
		t.Helper()
		a := rt.Invoke(t, scheduled)
		require.False(t, a.Error, "a function error: %s", a.Payload)
		var res sweep.Result
		require.NoError(t, json.Unmarshal(a.Payload, &res), "%s", a.Payload)
		require.Empty(t, res.Errors)
		return res
	}
	require.Equal(t, 1, pass().Changed["webhooks.expired_secrets"])
	require.Nil(t, env.Must(http.StatusOK, "GET", "/api/v1/webhooks/"+id, ws.Key, nil).JSON()["previous_secret_expires_at"])
	require.Equal(t, 0, pass().Changed["webhooks.expired_secrets"], "the same process, a second pass")
}

// An invocation runs every task of the pass once and answers what each
// changed.
func TestAnInvocationRunsOnePass(t *testing.T) {
	env := apitest.Start(t)
	res, err := handler(func() (*app.App, error) { return env.App, nil })(context.Background())
	require.NoError(t, err)
	var ran []string
	for name := range res.Changed {
		ran = append(ran, name)
	}
	slices.Sort(ran)
	tasks := env.App.Sweeper.Tasks()
	slices.Sort(tasks)
	require.Equal(t, tasks, ran)
	require.NotEmpty(t, tasks)
}

// A pass leaves the invocation answerReserve of its time: its tasks' time
// ends that much before the invocation's deadline, when Lambda stops the
// function without an answer (QA: a task was given up to that instant).
func TestAPassLeavesTheInvocationTimeToAnswer(t *testing.T) {
	var got time.Time
	probe := sweep.Task{Name: "probe", Run: func(ctx context.Context, _ time.Time) (int, error) {
		got, _ = ctx.Deadline()
		return 0, nil
	}}
	a := &app.App{Sweeper: sweep.New(time.Now, slog.New(slog.DiscardHandler), probe)}
	deadline := time.Now().Add(10 * time.Second) // under sweep.TaskTimeout: the invocation's deadline binds
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, err := handler(func() (*app.App, error) { return a, nil })(ctx)
	require.NoError(t, err)
	require.False(t, got.IsZero(), "the task ran with a deadline")
	require.False(t, got.After(deadline.Add(-answerReserve)), "task deadline %s, invocation's %s", got, deadline)
}

// A start that failed is the invocation's error, naming the cause, and the
// next invocation asks again (the process is not ended at init).
func TestAFailedStartIsTheInvocationsError(t *testing.T) {
	calls := 0
	h := handler(func() (*app.App, error) {
		calls++
		return nil, errors.New("DATABASE_URL is required")
	})
	for range 2 {
		_, err := h(context.Background())
		require.ErrorContains(t, err, "sweeper: start: DATABASE_URL is required")
	}
	require.Equal(t, 2, calls)
}
