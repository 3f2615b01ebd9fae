package gate_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// pauseBefore is a query tracer that, once armed, stops the first statement
// whose text starts with prefix before it is sent: it closes paused and
// waits for resume.
type pauseBefore struct {
	prefix         string
	armed          atomic.Bool
	paused, resume chan struct{}
}

func (p *pauseBefore) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(d.SQL), p.prefix) && p.armed.CompareAndSwap(true, false) {
		close(p.paused)
		<-p.resume
	}
	return ctx
}

func (p *pauseBefore) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A group's read (and a page of its steps) sees one moment: a rollback that
// ends between its reading of the group and of its steps is not shown half
// (review: the group read open, beside the compensation of its step that the
// rollback had performed meanwhile).
func TestAGroupIsReadInOneSnapshot(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"", "/steps"} {
		t.Run("groups"+path, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			g, _, d := b.groupWithStep("checkout", "")
			pause := &pauseBefore{prefix: "SELECT e.id, e.effect_type, e.idempotency_key, e.state,",
				paused: make(chan struct{}), resume: make(chan struct{})}
			pause.armed.Store(true)
			h := serverTraced(b, pause)

			read := make(chan *httptest.ResponseRecorder)
			go func() {
				req := httptest.NewRequest("GET", "/api/v1/groups/"+g+path, nil)
				req.Header.Set("Authorization", "Bearer "+b.ws.Key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				read <- rec
			}()
			<-pause.paused // the group is read; its steps are not yet

			u := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
			item := u["plan"].([]any)[0].(map[string]any)
			c := b.mustBegin("execute", map[string]any{"effect_type": "email.retract",
				"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": d["effect_id"]})
			require.Equal(t, http.StatusOK, b.report(str(c["effect_id"]), str(c["lease_token"]), "succeeded", nil).Status)
			close(pause.resume)

			rec := <-read
			require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
			require.NotContains(t, rec.Body.String(), str(c["effect_id"]),
				"the compensation begun after the group was read is not among its steps")
			if path == "" {
				require.Contains(t, rec.Body.String(), `"state":"open"`)
			}
		})
	}
}

// countBefore is a query tracer counting the statements whose text starts
// with prefix.
type countBefore struct {
	prefix string
	n      atomic.Int32
}

func (c *countBefore) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(d.SQL), c.prefix) {
		c.n.Add(1)
	}
	return ctx
}

func (c *countBefore) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A read of an unwinding group, which settles it first, reads its steps
// for the settle and for the answer, not a third time in a snapshot it
// then throws away (review of the snapshot read: a client polling its
// rollback read every step three times a poll).
func TestAnUnwindingGroupsReadReadsItsStepsOnceForTheAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, _, _ := b.groupWithStep("checkout", "")
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
	steps := &countBefore{prefix: "SELECT e.id, e.effect_type, e.idempotency_key, e.state, e.denial_code,"}
	h := serverTraced(b, steps)
	status, body := sendTo(t, h, "GET", "/api/v1/groups/"+g, b.ws.Key, nil)
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Equal(t, "unwinding", body["state"])
	require.Len(t, body["steps"], 1)
	require.Equal(t, int32(2), steps.n.Load(), "the settle's read of the steps and the answer's")
}
