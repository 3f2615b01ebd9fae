package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// examplesDir holds the Go SDK's runnable examples, from this package's
// directory.
const examplesDir = "../../sdk/go/examples"

// TestGoExamples builds the programs in sdk/go/examples and runs them as
// sdk/go/README.md's quickstart does, with the environment it exports,
// against the service: what each prints, and what the server then holds, is
// what the README and the programs' doc comments promise. A newcomer's first
// contact with the SDK must not rot unnoticed.
func TestGoExamples(t *testing.T) {
	t.Parallel()
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.WebhookAllowPrivateNetworks = true }))
	bin := buildExamples(t)
	base := "RATCHET_BASE_URL=" + b.env.Server.URL
	ctx := context.Background()

	t.Run("agent-gate", func(t *testing.T) {
		agent := "RATCHET_AGENT_KEY=" + b.env.Key(b.ws, map[string]any{"name": "agent", "preset": "AGENT"})
		sent := regexp.MustCompile(`^sent (msg_\d+) \(effect (eff_\w+), attempt 1\)\n$`)
		// Run twice: the first sends, the second answers the recorded result.
		twice := func(env ...string) *ratchet.Effect {
			out := runExample(t, bin, "agent-gate", env...)
			m := sent.FindStringSubmatch(out)
			require.NotNil(t, m, "the first run sends; it printed %q", out)
			require.Equal(t, "already sent earlier as "+m[1]+" (effect "+m[2]+"): not sending again\n",
				runExample(t, bin, "agent-gate", env...), "the second run does not send again")
			effect, err := b.operator.GetEffect(ctx, m[2])
			require.NoError(t, err)
			require.Equal(t, ratchet.EffectSucceeded, effect.State)
			require.Equal(t, 1, effect.Attempt, "one execute for both runs")
			var result struct {
				MessageID string `json:"message_id"`
			}
			require.NoError(t, json.Unmarshal(effect.Result, &result))
			require.Equal(t, m[1], result.MessageID, "the first run's result, recorded")
			return effect
		}
		plain := twice(base, agent)
		require.Equal(t, "welcome-email:user_456", plain.IdempotencyKey)
		// With a blinded key, the secret kept for both runs: another key
		// (so another effect), still sent once.
		secret := "0123456789abcdef0123456789abcdef"
		blinded := twice(base, agent, "RATCHET_BLIND_SECRET="+secret)
		require.Equal(t, ratchet.BlindKey(secret, "welcome-email:user_456"), blinded.IdempotencyKey)
		require.NotEqual(t, plain.ID, blinded.ID)

		out, err := exampleCmd(ctx, bin, "agent-gate", base).CombinedOutput()
		require.Error(t, err, "without its key the example fails")
		require.Contains(t, string(out), "RATCHET_AGENT_KEY is not set", "and says which variable is missing")
	})

	t.Run("onboarding", func(t *testing.T) {
		ingest := "RATCHET_INGEST_KEY=" + b.env.Key(b.ws, map[string]any{"name": "producer", "preset": "INGEST"})
		operator := "RATCHET_OPERATOR_KEY=" + b.ws.Key
		// The receiver subscribes to every event and prints each delivery it
		// verified; LISTEN keeps it off the default port.
		receiver := startExample(t, bin, "webhook-receiver", base, operator, "LISTEN=127.0.0.1:0")
		receiver.waitFor(t, regexp.MustCompile(`subscribed http://127\.0\.0\.1:\d+/ratchet as whk_\w+`))
		worker := startExample(t, bin, "onboarding-worker", base,
			"RATCHET_WORKER_KEY="+b.workerKey(t, "send_welcome_email@1"))

		// The producer follows its run until the worker has finished it.
		produce := func(customer, runStatus, stepStatus string) *ratchet.Run {
			out := runExample(t, bin, "onboarding-producer", base, ingest, "CUSTOMER_ID="+customer)
			m := regexp.MustCompile(`^run (run_\w+): step (stp_\w+) \(QUEUED, deduplicated=false\)\n`).FindStringSubmatch(out)
			require.NotNil(t, m, "the producer enqueues; it printed %q", out)
			require.Equal(t, m[0]+"run "+m[1]+" finished: "+runStatus+"\n  send_welcome_email@1 "+stepStatus+" after 1 attempt(s)\n", out)
			run, err := b.operator.GetRun(ctx, m[1])
			require.NoError(t, err)
			require.Equal(t, runStatus, run.Status)
			s := step(t, run, m[2])
			require.Equal(t, stepStatus, s.Status)
			require.Equal(t, "welcome:"+customer+":"+run.ID, s.IdempotencyKey, "the key names the customer and the run")
			require.Equal(t, "Email service", s.Endpoint)
			require.Len(t, s.DurableJob.Attempts, 1)
			return run
		}
		succeeded := produce("cus_2048", ratchet.RunSucceeded, ratchet.JobSucceeded)
		failed := produce("fail-400", ratchet.RunFailed, ratchet.JobExhausted)
		attempt := failed.Steps[0].DurableJob.Attempts[0]
		require.NotNil(t, attempt.ErrorMessage)
		require.Equal(t, "provider rejected validation", *attempt.ErrorMessage)
		require.False(t, *attempt.Retryable, "a 400 is not retried")
		worker.waitFor(t, regexp.MustCompile(`sent welcome e-mail for job job_\w+ \(attempt 1\)`))

		// Deliver the runs' events (the local server's sweeper would): the
		// receiver verifies and prints each.
		now := time.Now().Add(time.Second) // see TestWebhooks' sweepTime
		_, err := b.env.App.Server.Webhooks.Dispatch(ctx, now)
		require.NoError(t, err)
		_, err = b.env.App.Server.Webhooks.Deliver(ctx, now)
		require.NoError(t, err)
		receiver.waitFor(t, regexp.MustCompile(`run\.finished about `+succeeded.ID+`: \{"status":"SUCCEEDED","synthetic":false\}`))
		receiver.waitFor(t, regexp.MustCompile(`run\.finished about `+failed.ID+`: \{"status":"FAILED","synthetic":false\}`))
		receiver.waitFor(t, regexp.MustCompile(`step\.exhausted about `+failed.Steps[0].ID))

		// Ctrl-C: the worker stops gracefully, the receiver unsubscribes.
		worker.interrupt(t)
		require.Contains(t, worker.output(), "stopping: finishing running jobs")
		receiver.interrupt(t)
		require.Regexp(t, `unsubscribed whk_\w+`, receiver.output())
		hooks, err := b.operator.ListWebhooks(ctx, ratchet.ListQuery{})
		require.NoError(t, err)
		require.Empty(t, hooks.Data)
	})
}

// buildExamples builds every program in sdk/go/examples into a temporary
// directory and returns it.
func buildExamples(t *testing.T) string {
	t.Helper()
	// go test puts its own toolchain's bin first on the PATH.
	gobin, err := exec.LookPath("go")
	require.NoError(t, err, "the examples are built with the go command")
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", bin+string(filepath.Separator), "./...")
	cmd.Dir = examplesDir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building the examples:\n%s", out)
	return bin
}

// exampleCmd is the example name with env as its whole environment (beyond
// what running a program needs), so that a variable of the test's own
// environment cannot stand in for one the README has the reader export.
func exampleCmd(ctx context.Context, bin, name string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name))
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	return cmd
}

// runExample runs the example to its end, requiring success, and returns
// what it printed on stdout.
func runExample(t *testing.T, bin, name string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	cmd := exampleCmd(ctx, bin, name, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s failed:\n%s%s", name, out, stderr.String())
	return string(out)
}

// running is an example started in the background.
type running struct {
	name string
	cmd  *exec.Cmd
	out  apitest.LockedBuffer // stdout and stderr
	done chan error
}

func (r *running) output() string { return r.out.String() }

// startExample starts the example, killed when the test ends if still
// running.
func startExample(t *testing.T, bin, name string, env ...string) *running {
	t.Helper()
	r := &running{name: name, done: make(chan error, 1)}
	r.cmd = exampleCmd(context.Background(), bin, name, env...)
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	require.NoError(t, r.cmd.Start())
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// waitFor waits until the example has printed a line matching re, failing
// if it exits first or after a minute (a hang guard).
func (r *running) waitFor(t *testing.T, re *regexp.Regexp) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !re.MatchString(r.output()) {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("%s exited (%v) before printing %s:\n%s", r.name, err, re, r.output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never printed %s:\n%s", r.name, re, r.output())
		}
	}
}

// interrupt sends the example Ctrl-C's signal and requires it to exit
// successfully (within a minute: a hang guard).
func (r *running) interrupt(t *testing.T) {
	t.Helper()
	require.NoError(t, r.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-r.done:
		r.done <- err
		require.NoError(t, err, "%s after Ctrl-C:\n%s", r.name, r.output())
	case <-time.After(time.Minute):
		t.Fatalf("%s did not stop after Ctrl-C:\n%s", r.name, r.output())
	}
	require.False(t, strings.Contains(r.output(), "panic"), r.output())
}
