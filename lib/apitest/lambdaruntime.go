package apitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// LambdaRuntime stands in for AWS Lambda's Runtime API (the interface a
// function's process polls for invocations: GET …/invocation/next, then
// POST …/invocation/{id}/response or /error), so that a test can run a
// function's real entry point, lambda.Start included, as Lambda runs it.
// Point the process at it with AWS_LAMBDA_RUNTIME_API=Addr().
type LambdaRuntime struct {
	srv     *httptest.Server
	pending chan invocation

	mu      sync.Mutex
	answers map[string]chan LambdaAnswer
	initErr []byte
	seq     int
}

type invocation struct {
	id    string
	event []byte
}

// LambdaAnswer is what the function posted for one invocation: its
// response's payload, or (Error true) its error's.
type LambdaAnswer struct {
	Payload []byte
	Error   bool
}

const runtimePrefix = "/2018-06-01/runtime/"

// NewLambdaRuntime serves a Runtime API until the test ends.
func NewLambdaRuntime(t testing.TB) *LambdaRuntime {
	r := &LambdaRuntime{pending: make(chan invocation), answers: map[string]chan LambdaAnswer{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// Addr is the host:port for AWS_LAMBDA_RUNTIME_API.
func (r *LambdaRuntime) Addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *LambdaRuntime) serve(w http.ResponseWriter, req *http.Request) {
	path := strings.TrimPrefix(req.URL.Path, runtimePrefix)
	body, _ := io.ReadAll(req.Body)
	switch {
	case req.Method == http.MethodGet && path == "invocation/next":
		// Held until the test invokes, as Lambda holds a function between
		// invocations; the server's close ends the wait.
		select {
		case inv := <-r.pending:
			w.Header().Set("Lambda-Runtime-Aws-Request-Id", inv.id)
			w.Header().Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(30*time.Second).UnixMilli(), 10))
			w.Header().Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:000000000000:function:ratchet-test")
			w.Header().Set("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000")
			_, _ = w.Write(inv.event)
		case <-req.Context().Done():
		}
	case req.Method == http.MethodPost && path == "init/error":
		r.mu.Lock()
		r.initErr = body
		r.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	case req.Method == http.MethodPost && strings.HasPrefix(path, "invocation/"):
		id, kind, _ := strings.Cut(strings.TrimPrefix(path, "invocation/"), "/")
		r.mu.Lock()
		answer, ok := r.answers[id]
		delete(r.answers, id)
		r.mu.Unlock()
		if !ok || (kind != "response" && kind != "error") {
			http.Error(w, "unknown invocation", http.StatusBadRequest)
			return
		}
		answer <- LambdaAnswer{Payload: body, Error: kind == "error"}
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, req)
	}
}

// Invoke hands event (marshalled to JSON) to the function and waits for
// its answer, failing the test after a minute.
func (r *LambdaRuntime) Invoke(t testing.TB, event any) LambdaAnswer {
	t.Helper()
	raw, err := json.Marshal(event)
	require.NoError(t, err)
	r.mu.Lock()
	r.seq++
	inv := invocation{id: fmt.Sprintf("inv-%d", r.seq), event: raw}
	answer := make(chan LambdaAnswer, 1)
	r.answers[inv.id] = answer
	r.mu.Unlock()
	timeout := time.After(time.Minute)
	select {
	case r.pending <- inv:
	case <-timeout:
		t.Fatalf("the function never asked for invocation %s (init error: %s)", inv.id, r.InitError())
	}
	select {
	case a := <-answer:
		return a
	case <-timeout:
		t.Fatalf("the function never answered invocation %s", inv.id)
		return LambdaAnswer{}
	}
}

// InitError is the error the function reported at its start, if any.
func (r *LambdaRuntime) InitError() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.initErr
}

// FunctionMainEnv, set to "1", tells a function package's TestMain to run
// the function's main instead of its tests (StartFunction).
const FunctionMainEnv = "RATCHET_FUNCTION_MAIN"

// FunctionMain is Main for a Lambda function's package, whose tests start
// its process (StartFunction): in that process it runs main instead, which
// lambda.Start keeps from returning. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(apitest.FunctionMain(m, main)) }
func FunctionMain(m *testing.M, main func()) int {
	if os.Getenv(FunctionMainEnv) == "1" {
		main()
		return 0
	}
	return Main(m)
}

// StartFunction runs this test binary again as the function's process,
// polling r for invocations, configured over the package database (with
// extra NAME=value settings after); its TestMain is FunctionMain. The
// process is killed when the test ends; the func it answers reads what the
// process has logged so far.
func (r *LambdaRuntime) StartFunction(t testing.TB, extra ...string) (logs func() string) {
	t.Helper()
	cfg := Config(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), FunctionMainEnv+"=1", "AWS_LAMBDA_RUNTIME_API="+r.Addr(),
		"DATABASE_URL="+cfg.DatabaseURL, "RESULT_ENCRYPTION_KEY="+cfg.ResultEncryptionKey,
		"KEY_HASH_SECRET="+cfg.KeyHashSecret, "CRON_SECRET="+cfg.CronSecret)
	cmd.Env = append(cmd.Env, extra...)
	var out LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return out.String
}
