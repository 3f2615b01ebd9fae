package apitest

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The model tests (lib/gate's and lib/jobs's model_test.go) run random
// sequences of operations from seeds: MODEL_SEED=<n> replays one seed,
// MODEL_SEEDS=<n> runs n seeds from 1, MODEL_OPS=<n> sets each sequence's
// length.

// ModelSeeds is the seeds to run: MODEL_SEED alone when set, else
// MODEL_SEEDS (default n) seeds from 1.
func ModelSeeds(t testing.TB, n int) []uint64 {
	t.Helper()
	if s := os.Getenv("MODEL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("MODEL_SEED=%q: %v", s, err)
		}
		return []uint64{seed}
	}
	n = ModelEnvInt(t, "MODEL_SEEDS", n)
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

// ModelEnvInt reads a positive integer from the environment variable name,
// def when it is not set.
func ModelEnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// Canonical is raw JSON re-encoded with sorted keys and no spaces, so that
// two encodings of one value compare equal ("!" and raw for JSON that does
// not parse).
func Canonical(raw []byte) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "!" + string(raw)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// CanonicalOf is Canonical of v's JSON.
func CanonicalOf(v any) string {
	raw, _ := json.Marshal(v)
	return Canonical(raw)
}

// ModelRuns runs a model test's sequence for each of its seeds
// (ModelSeeds, n by default) as a subtest named by the seed, each ops
// operations long unless MODEL_OPS says otherwise.
func ModelRuns(t *testing.T, n, ops int, run func(t *testing.T, seed uint64, ops int)) {
	t.Helper()
	for _, seed := range ModelSeeds(t, n) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { run(t, seed, ModelEnvInt(t, "MODEL_OPS", ops)) })
	}
}

// ModelTrace is a model test's sequence as it ran: a numbered line an
// operation, and the first mismatch reported with the command that replays
// the sequence and the trace up to it (later ones would follow from it).
type ModelTrace struct {
	t      testing.TB
	replay string
	lines  []string
	failed bool
}

// NewModelTrace starts the trace of a sequence that replay (a command)
// runs again.
func NewModelTrace(t testing.TB, replay string) *ModelTrace { return &ModelTrace{t: t, replay: replay} }

// Add appends an operation's line.
func (m *ModelTrace) Add(line string) {
	m.lines = append(m.lines, fmt.Sprintf("%3d %s", len(m.lines)+1, line))
}

// Len is how many lines the trace has.
func (m *ModelTrace) Len() int { return len(m.lines) }

// Failed is whether Fail was called: a sequence stops at its first
// mismatch, as later operations would follow from it.
func (m *ModelTrace) Failed() bool { return m.failed }

// Fail reports a mismatch, the first one only, with the replay command and
// the trace.
func (m *ModelTrace) Fail(format string, args ...any) {
	m.t.Helper()
	if m.failed {
		return
	}
	m.failed = true
	m.t.Errorf("model mismatch (replay: %s): %s\ntrace:\n  %s", m.replay, fmt.Sprintf(format, args...),
		strings.Join(m.lines, "\n  "))
}
