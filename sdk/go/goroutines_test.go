package ratchet

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// The tests of this file stop a worker, or end a call, in each state where
// it has goroutines of its own at work, and check that none of them is left
// running afterwards. They compare the goroutines running the SDK's code
// before and after, so they do not call t.Parallel: Go runs them before any
// parallel test of the package is let go, and nothing else then starts SDK
// goroutines of its own.

// sdkSourceDir is the directory of the SDK's source files.
var sdkSourceDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}()

// sdkGoroutines returns, by goroutine id, the stacks of the goroutines that
// run the SDK's own code (a file of the package that is not a test's), or
// that its code started.
func sdkGoroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	found := map[string]string{}
	for _, stack := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(stack, "\n")
		if fields := strings.Fields(header); len(fields) > 1 && runsSDKCode(stack) {
			found[fields[1]] = stack
		}
	}
	return found
}

// runsSDKCode says whether one goroutine's stack names a source file of the
// SDK's that is not a test's.
func runsSDKCode(stack string) bool {
	for _, line := range strings.Split(stack, "\n") {
		file, _, ok := strings.Cut(strings.TrimSpace(line), ".go:")
		if ok && filepath.Dir(file) == sdkSourceDir && !strings.HasSuffix(file, "_test") {
			return true
		}
	}
	return false
}

// awaitSDKGoroutinesEnd waits until every goroutine of the SDK's that was
// not running at before has ended, for up to a minute (a loaded machine
// schedules them late), and fails with their stacks otherwise.
func awaitSDKGoroutinesEnd(t *testing.T, before map[string]string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		left = left[:0]
		for id, stack := range sdkGoroutines() {
			if _, old := before[id]; !old {
				left = append(left, stack)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	slices.Sort(left)
	t.Fatalf("%d goroutine(s) of the SDK still running:\n\n%s", len(left), strings.Join(left, "\n\n"))
}

// A worker leaves no goroutine of its own running once it has stopped,
// whether Stop or the end of Start's context stopped it, and whatever it
// was doing then: waiting on a long-polling claim nobody answers, running a
// handler, waiting on a heartbeat nobody answers, or sending a report
// nobody answers. Stop's deadline passes in each (the handler honours its
// context, and so leaves no goroutine of the test's).
func TestStoppedWorkerLeavesNoGoroutine(t *testing.T) {
	for _, state := range []string{"claim", "handler", "heartbeat", "report"} {
		for _, end := range []string{"Stop", "Start's context"} {
			t.Run(state+" then "+end, func(t *testing.T) {
				before := sdkGoroutines()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				w := workerBusyWith(t, ctx, state)
				if end == "Stop" {
					stopCtx, cancelStop := context.WithTimeout(context.Background(), 100*time.Millisecond)
					defer cancelStop()
					stopped := make(chan error, 1)
					go func() { stopped <- w.Stop(stopCtx) }()
					select {
					case err := <-stopped:
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Fatalf("Stop = %v", err)
						}
					case <-time.After(time.Minute):
						t.Fatal("Stop outlived its deadline and graces")
					}
				} else {
					cancel()
					select {
					case <-w.Done():
					case <-time.After(time.Minute):
						t.Fatal("the worker went on after Start's context ended")
					}
				}
				awaitSDKGoroutinesEnd(t, before)
			})
		}
	}
}

// workerBusyWith starts a worker under ctx (stop grace 100 ms) and returns
// once it is in state: waiting on a long-polling claim ("claim"), running
// a handler that returns when its context ends ("handler"), waiting on a
// heartbeat while it does ("heartbeat"), or waiting on the report of a
// handler that returned ("report"). Nobody answers the call it waits on.
func workerBusyWith(t *testing.T, ctx context.Context, state string) *Worker {
	t.Helper()
	f := newFakeJobs()
	f.leaseFor = 3 * time.Second // a heartbeat after a second
	running := make(chan struct{}, 2)
	handler := func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
		running <- struct{}{}
		if state == "report" {
			return welcomeOut{Sent: true}, nil
		}
		<-ctx.Done()
		return welcomeOut{}, ctx.Err()
	}
	hung := map[string]string{"claim": "/claim", "handler": "/nothing", "heartbeat": "/heartbeat", "report": "/report"}[state]
	c, arrived := hangingClient(t, f, hung)
	if state != "claim" {
		f.add("t", "1", welcomeIn{}, 60000)
		f.add("t", "1", welcomeIn{}, 60000) // a batch of reports, or a second handler
	}
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1", Handler: handler}))
	must(t, w.Start(ctx, StartOptions{Concurrency: 2, WaitSeconds: 20, PollInterval: time.Hour,
		StopGrace: 100 * time.Millisecond, OnError: func(error) {}}))
	if state == "handler" {
		<-running
		<-running
	} else {
		<-arrived
	}
	return w
}

// A call that ends with its context leaves no goroutine of the SDK's
// running: a long-polling claim nobody answers, and DoEffect cancelled, or
// its action panicking, while a heartbeat nobody answers is in flight (its
// heartbeats run on a goroutine of their own).
func TestEndedCallLeavesNoGoroutine(t *testing.T) {
	t.Run("claim", func(t *testing.T) {
		before := sdkGoroutines()
		c, arrived := hangingClient(t, newFakeJobs(), "/claim")
		ctx, cancel := context.WithCancel(context.Background())
		claimed := make(chan error, 1)
		go func() {
			_, err := c.ClaimKeyed(ctx, "wkr_1", NewClaimID(), 1, 20)
			claimed <- err
		}()
		<-arrived
		cancel()
		if err := <-claimed; !errors.Is(err, context.Canceled) {
			t.Fatalf("ClaimKeyed = %v", err)
		}
		awaitSDKGoroutinesEnd(t, before)
	})
	for _, ending := range []string{"cancelled", "panicking"} {
		t.Run("DoEffect "+ending, func(t *testing.T) {
			before := sdkGoroutines()
			g := &fakeGate{answers: []func(http.ResponseWriter){decision(200, map[string]any{"decision": "execute",
				"effect_id": "eff_1", "state": "leased", "attempt": 1, "lease_token": "lt_1",
				"lease_expires_at": time.Now().Add(3 * time.Second)})}} // a heartbeat after a second
			c, heartbeating := hangingClient(t, g, "/heartbeat")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan any, 1)
			go func() {
				defer func() { done <- recover() }()
				_, err := DoEffect(ctx, c, beginReq, func(ctx context.Context, _ Lease) (sendResult, error) {
					<-heartbeating
					if ending == "panicking" {
						panic("action bug")
					}
					cancel()
					<-ctx.Done()
					return sendResult{}, ctx.Err()
				})
				if !errors.Is(err, context.Canceled) {
					t.Errorf("DoEffect = %v", err)
				}
			}()
			if p := <-done; (ending == "panicking") != (p != nil) {
				t.Fatalf("DoEffect panicked with %v", p)
			}
			awaitSDKGoroutinesEnd(t, before)
		})
	}
}
