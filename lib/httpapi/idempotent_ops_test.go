package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
)

// Clients hammering one key in rounds while the route refuses its first
// three acts (each after writing, in its request transaction): each refusal
// frees the key and rolls its write back, then exactly one request acts
// and commits; every other answer is the refusal, 409 retry_request, or
// that success given again byte for byte, marked replayed and naming the
// request that acted.
func TestIdempotencyKeyHammeredThroughRefusalsActsOnce(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if err != nil {
			return nil, err
		}
		if calls.Add(1) <= 3 {
			return nil, apierr.InvalidField("url", "is refused this time")
		}
		return hook, nil
	})
	const clients = 12
	var created, actedBy string
	for round := 0; round < 8; round++ {
		recs := make([]*httptest.ResponseRecorder, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() { recs[i] = sendKeyed(srv, ws.Key, "hammer") })
		}
		wg.Wait()
		for _, rec := range recs {
			switch rec.Code {
			case http.StatusBadRequest:
				require.Contains(t, rec.Body.String(), "is refused this time")
			case http.StatusConflict:
				require.Contains(t, rec.Body.String(), `"code":"retry_request"`)
			case http.StatusCreated:
				if rec.Header().Get(httpapi.ReplayedHeader) == "" {
					require.Empty(t, created, "a second request acted: %s", rec.Body)
					created, actedBy = rec.Body.String(), rec.Header().Get(httpapi.RequestIDHeader)
				}
			default:
				t.Fatalf("answered %d: %s", rec.Code, rec.Body)
			}
		}
		for _, rec := range recs {
			if rec.Code == http.StatusCreated && rec.Header().Get(httpapi.ReplayedHeader) != "" {
				require.Equal(t, created, rec.Body.String())
				require.Equal(t, actedBy, rec.Header().Get(httpapi.OriginalRequestHeader))
			}
		}
	}
	require.NotEmpty(t, created, "no request acted in eight rounds")
	require.Equal(t, 1, webhookCount(t, env, ws.Key), "the refused acts rolled back, one committed")
	require.GreaterOrEqual(t, calls.Load(), int32(4))
}

// A client that goes away while its request acts under a key: the request
// rolls back and frees the key, and the retry acts at once (not 409
// retry_request for the claim's 30 seconds) and makes the one webhook.
func TestIdempotencyKeyOfARequestWhoseClientLeftIsFree(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	acting := make(chan struct{})
	var calls atomic.Int32
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if err != nil {
			return nil, err
		}
		if calls.Add(1) == 1 {
			close(acting)
			<-ctx.Done() // the client hangs up
			return nil, ctx.Err()
		}
		return hook, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("POST", "/api/v1/test/left", strings.NewReader(`{}`)).WithContext(ctx)
	req.Header.Set("Authorization", "Bearer "+ws.Key)
	req.Header.Set(idempotency.Header, "create-left")
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-acting
	cancel()
	<-done
	requireRetryActs(t, env, srv, ws.Key, "left")
}

// A large answer (megabytes: a reconciliation's, say) is kept and given
// again byte for byte, as a small one is.
func TestIdempotencyKeyKeepsALargeAnswerWhole(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	blob := strings.Repeat("0123456789abcdef", 1<<18) // 4 MiB
	srv := keyedServer(env, func(context.Context, *httpapi.Call) (any, error) {
		return map[string]any{"n": calls.Add(1), "blob": blob}, nil
	})
	first := sendKeyed(srv, ws.Key, "large")
	require.Equal(t, http.StatusCreated, first.Code)
	require.Greater(t, first.Body.Len(), len(blob))
	again := sendKeyed(srv, ws.Key, "large")
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, "true", again.Header().Get(httpapi.ReplayedHeader))
	require.Equal(t, first.Body.String(), again.Body.String())
	require.EqualValues(t, 1, calls.Load())
}
