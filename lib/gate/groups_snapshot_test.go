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
