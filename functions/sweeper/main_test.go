package main

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/app"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

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
