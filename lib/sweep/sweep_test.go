package sweep

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRunOnceRunsEveryTaskDespiteFailures(t *testing.T) {
	t.Parallel()
	var ran []string
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		Task{Name: "a", Run: func(context.Context, time.Time) (int, error) { ran = append(ran, "a"); return 0, errors.New("boom") }},
		Task{Name: "b", Run: func(context.Context, time.Time) (int, error) { ran = append(ran, "b"); return 3, nil }},
	)
	res := s.RunOnce(context.Background())
	require.Equal(t, []string{"a", "b"}, ran)
	require.Equal(t, 3, res.Changed["b"])
	require.Equal(t, "failed", res.Errors["a"], "no error text leaves the process")
	require.Error(t, res.Error())
	require.Equal(t, []string{"a", "b"}, s.Tasks())
}
