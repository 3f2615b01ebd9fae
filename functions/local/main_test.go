package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

func TestMain(m *testing.M) {
	if os.Getenv("RATCHET_LOCAL_MAIN") == "1" {
		// A child serving as the server (serverDraining, crashServer) runs
		// over its parent's database: provisioning one of its own cost each
		// start a migration, and each kill a database never dropped.
		os.Exit(m.Run())
	}
	os.Exit(apitest.Main(m))
}

// TestLocalServerServesEveryDoor runs the real entry point on a free port:
// migrations applied, health, signup, key minting and the /v1 alias.
func TestLocalServerServesEveryDoor(t *testing.T) {
	localEnv(t)

	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, io.Discard, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("server exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	base := "http://" + addr
	host, _, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	require.True(t, net.ParseIP(host).IsLoopback(), "listens on %s: not reachable from the network by default", host)

	res, err := http.Get(base + "/api/v1/health")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	res.Body.Close()

	res, err = http.Post(base+"/v1/workspaces", "application/json", bytes.NewReader([]byte(`{"name":"local"}`)))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	var signup struct {
		Key struct {
			Secret string `json:"secret"`
		} `json:"key"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&signup))
	res.Body.Close()

	req, _ := http.NewRequest("POST", base+"/api/v1/keys", bytes.NewReader([]byte(`{"name":"agent","preset":"AGENT"}`)))
	req.Header.Set("Authorization", "Bearer "+signup.Key.Secret)
	res, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	res.Body.Close()

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop")
	}
}

// The line the server prints names an address a browser on the machine
// opens, and says when other machines can reach it too.
func TestListeningOnSaysWhoCanReachTheServer(t *testing.T) {
	for _, c := range []struct {
		ip   string
		want string
	}{
		{"127.0.0.1", "http://localhost:8787"},
		{"::1", "http://localhost:8787"},
		{"0.0.0.0", "http://localhost:8787 and every other interface"},
		{"::", "http://localhost:8787 and every other interface"},
		{"192.0.2.7", "http://192.0.2.7:8787"},
		{"2001:db8::7", "http://[2001:db8::7]:8787"},
	} {
		require.Equal(t, c.want, listeningOn(&net.TCPAddr{IP: net.ParseIP(c.ip), Port: 8787}), c.ip)
	}
}

func TestLocalServerRefusesBadConfig(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("RESULT_ENCRYPTION_KEY", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)))
	t.Setenv("KEY_HASH_SECRET", "local-test-secret-0123456789")
	err := run(context.Background(), io.Discard, nil)
	require.ErrorContains(t, err, "DATABASE_URL is required")
}

// A request in flight when the server is told to stop gets its answer
// before the pool closes: Serve returns as soon as Shutdown begins, and run
// waits for the shutdown (review: a long-polling claim answered 500
// "closed pool").
func TestLocalServerDrainsRequestsBeforeClosing(t *testing.T) {
	localEnv(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, io.Discard, ready) }()
	base := "http://" + <-ready
	post := func(path, key string, body string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", base+path, bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+key)
		return http.DefaultClient.Do(req)
	}
	res, err := post("/api/v1/workspaces", "", `{"name":"drain"}`)
	require.NoError(t, err)
	var signup struct {
		Key struct {
			Secret string `json:"secret"`
		} `json:"key"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&signup))
	res.Body.Close()
	res, err = post("/api/v1/workers/register", signup.Key.Secret, `{"tools":[{"name":"t","version":"1"}]}`)
	require.NoError(t, err)
	var reg struct {
		WorkerID string `json:"workerId"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&reg))
	res.Body.Close()

	// The claim is parked in its long poll once its first look has marked
	// the worker seen (a fixed sleep here let a late claim meet a closed
	// listener: status 0, not 200). A claim marks its worker at most once a
	// minute, so the registration is dated two minutes back first.
	pg, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer pg.Close(context.Background())
	_, err = pg.Exec(context.Background(), `UPDATE job_workers SET created_at = created_at - interval '2 minutes',
		last_seen_at = last_seen_at - interval '2 minutes' WHERE id = $1`, reg.WorkerID)
	require.NoError(t, err)
	claimed := make(chan int, 1)
	go func() {
		res, err := post("/api/v1/workers/"+reg.WorkerID+"/claim", signup.Key.Secret, `{"waitSeconds":2}`)
		if err != nil {
			claimed <- 0
			return
		}
		res.Body.Close()
		claimed <- res.StatusCode
	}()
	require.Eventually(t, func() bool {
		var looked bool
		err := pg.QueryRow(context.Background(), `SELECT last_seen_at > created_at FROM job_workers WHERE id = $1`,
			reg.WorkerID).Scan(&looked)
		return err == nil && looked
	}, 10*time.Second, 5*time.Millisecond, "the claim reached the server")
	cancel()
	require.NoError(t, <-done)
	select {
	case status := <-claimed:
		require.Equal(t, http.StatusOK, status, "answered in full before the pool closed")
	case <-time.After(10 * time.Second):
		t.Fatal("the claim never got an answer")
	}
}

// localEnv sets the environment a local server of the tests starts with.
func localEnv(t *testing.T) {
	t.Helper()
	t.Setenv("DATABASE_URL", apitest.DatabaseURL(t))
	t.Setenv("RESULT_ENCRYPTION_KEY", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)))
	t.Setenv("KEY_HASH_SECRET", "local-test-secret-0123456789")
	t.Setenv("PORT", "0")
	t.Setenv("BIND_ADDRESS", "") // restored after the test
	require.NoError(t, os.Unsetenv("BIND_ADDRESS"), "the default address")
	t.Setenv("SWEEP_INTERVAL", "50ms")
}

// serverDraining runs this package's main in a child process (the test
// named run, which calls main when RATCHET_LOCAL_MAIN is set), sends it a
// request whose body never finishes, which keeps a drain waiting, and
// returns the child and a channel its exit is sent on.
func serverDraining(t *testing.T, run string) (*exec.Cmd, <-chan error) {
	t.Helper()
	localEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$")
	cmd.Env = append(os.Environ(), "RATCHET_LOCAL_MAIN=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // already gone when the test passes
	lines := bufio.NewScanner(stderr)
	var addr string
	for lines.Scan() {
		if _, rest, ok := strings.Cut(lines.Text(), "listening on http://localhost:"); ok {
			addr = "127.0.0.1:" + strings.Fields(rest)[0]
			break
		}
	}
	require.NotEmpty(t, addr, "the server never said where it listens")
	go io.Copy(io.Discard, stderr) //nolint:errcheck // keep the child's stderr flowing

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /api/v1/workspaces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"na")
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, exited
}

// quitsOnTheNextInterrupt checks that another interrupt ends the draining
// child at once.
func quitsOnTheNextInterrupt(t *testing.T, cmd *exec.Cmd, exited <-chan error) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-exited:
		require.Error(t, err, "killed by the second interrupt")
	case <-time.After(5 * time.Second):
		t.Fatal("the second interrupt did not end the process")
	}
}

// A second interrupt ends the process at once, even while the first one's
// drain waits for a request in flight (review: it was ignored, leaving a
// developer 25 s of a terminal that would not stop).
func TestLocalServerQuitsOnASecondInterrupt(t *testing.T) {
	if os.Getenv("RATCHET_LOCAL_MAIN") == "1" {
		main()
		return
	}
	cmd, exited := serverDraining(t, "TestLocalServerQuitsOnASecondInterrupt")
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-exited:
		t.Fatalf("the first interrupt should drain the request in flight, but the server exited: %v", err)
	case <-time.After(time.Second):
	}
	quitsOnTheNextInterrupt(t, cmd, exited)
}

// One Ctrl-C drains, though it reaches the server twice: a terminal sends
// SIGINT to its whole foreground process group, and scripts/dev's pgenv,
// in that group too, forwards what it gets to the server (QA: the copy
// counted as the second interrupt, and a single Ctrl-C cut the requests in
// flight, a long-polling claim answered with a closed connection, five
// times in six). A later interrupt still ends the process at once.
func TestLocalServerDrainsOnOneInterruptDeliveredTwice(t *testing.T) {
	if os.Getenv("RATCHET_LOCAL_MAIN") == "1" {
		main()
		return
	}
	cmd, exited := serverDraining(t, "TestLocalServerDrainsOnOneInterruptDeliveredTwice")
	// The terminal's SIGINT and pgenv's copy of it, a moment apart.
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-exited:
		t.Fatalf("one interrupt, delivered twice, should drain the request in flight, but the server exited: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	quitsOnTheNextInterrupt(t, cmd, exited)
}

// A start that cannot reach the database tries again until it can (crash
// QA: a server restarted during an outage exited at once and stayed down);
// one the database refuses, or that fails otherwise, gives up at once.
func TestStartWaitsForAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	away := fmt.Errorf("migrate: connect: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")})
	tries := 0
	got, err := whenReachable(context.Background(), logger, time.Minute, func() (int, error) {
		if tries++; tries < 3 {
			return 0, away
		}
		return 7, nil
	})
	require.NoError(t, err)
	require.Equal(t, 7, got)
	require.Equal(t, 3, tries)

	for _, refused := range []error{
		fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01"}), // wrong password
		errors.New("config: KEY_HASH_SECRET is required"),
	} {
		tries = 0
		_, err = whenReachable(context.Background(), logger, time.Minute, func() (int, error) { tries++; return 0, refused })
		require.ErrorIs(t, err, refused)
		require.Equal(t, 1, tries)
	}

	// It gives up once the wait has passed.
	tries = 0
	_, err = whenReachable(context.Background(), logger, 0, func() (int, error) { tries++; return 0, away })
	require.ErrorIs(t, err, away)
	require.Equal(t, 1, tries)
}

// Told to stop while it waits for the database (an interrupt during an
// outage), it stops waiting at once: start is not tried again, and the
// error says both that it was stopped and why the last try failed.
func TestStartStopsWaitingWhenCancelled(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	away := fmt.Errorf("migrate: connect: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tries := 0
	_, err := whenReachable(ctx, logger, time.Hour, func() (int, error) {
		if tries++; tries > 1 {
			return 7, nil // a second try would succeed: it must not happen
		}
		cancel() // the interrupt lands while this try fails
		return 0, away
	})
	require.Equal(t, 1, tries, "start was tried again after the context ended")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, away, "the last try's failure is still reported")
}
