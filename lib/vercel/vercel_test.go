package vercel_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/api/cron"
	v1 "github.com/getratchet/ratchet/api/v1"
	"github.com/getratchet/ratchet/api/v1/effects"
	effectsid "github.com/getratchet/ratchet/api/v1/effects/id"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/app"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// The Vercel functions (api/**.go), each serving its routes with the
// instance's app.Default as Vercel runs them, log nothing a caller chose
// (lib/sdktest's TestNothingUserControlledIsLogged, through the generated
// handlers): marked values in bodies, queries, headers and a rewritten
// path parameter, a key and a cron secret that are not, a body whose read
// panics with a marked error, and a begin failing on an error quoting its
// key (apitest.RefuseMarked). The log is the process's stderr, JSON at
// Info, as deployed. Not parallel: it swaps os.Stderr for the app's logger.
func TestTheVercelFunctionsLogNothingUserControlled(t *testing.T) {
	cfg := apitest.Config(t)
	t.Setenv("DATABASE_URL", cfg.DatabaseURL)
	t.Setenv("RESULT_ENCRYPTION_KEY", cfg.ResultEncryptionKey)
	t.Setenv("KEY_HASH_SECRET", cfg.KeyHashSecret)
	t.Setenv("CRON_SECRET", cfg.CronSecret)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stderr := os.Stderr
	os.Stderr = w // app.Default's logger writes to os.Stderr as it is when it is built: here, now
	var logs apitest.LockedBuffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&logs, r); close(copied) }()
	a, err := app.Default()
	os.Stderr = stderr
	require.NoError(t, err)
	apitest.RefuseMarked(t, a.Pool)

	n := 0
	c := func(label string) string { n++; return apitest.Marked(label, n) }
	serve := func(h http.HandlerFunc, method, target, key string, body io.Reader) map[string]any {
		t.Helper()
		req := httptest.NewRequest(method, target, body)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Leak", c("header"))
		req.Header.Set("Idempotency-Key", c("idem"))
		rec := httptest.NewRecorder()
		h(rec, req)
		t.Logf("%s %s → %d %.200s", method, target, rec.Code, rec.Body)
		var out map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		return out
	}
	text := func(s string) io.Reader { return strings.NewReader(s) }

	ws := serve(v1.V1Workspaces, "POST", "/api/v1/workspaces", "", text(`{"name":"`+c("workspace")+`"}`))
	root, _ := ws["key"].(map[string]any)["secret"].(string)
	require.NotEmpty(t, root, "%v", ws)
	begin := serve(effects.V1EffectsBegin, "POST", "/api/v1/effects/begin", root,
		text(`{"effect_type":"push.send","idempotency_key":"`+c("key")+`","payload":{"to":"`+c("payload")+`"}}`))
	token, _ := begin["lease_token"].(string)
	require.NotEmpty(t, token, "%v", begin)
	id, _ := begin["effect_id"].(string)
	serve(effectsid.V1EffectsIdReport, "POST", "/api/v1/effects/id/report?id="+id, root,
		text(`{"lease_token":"`+c("token")+`","outcome":"succeeded","result":{"id":"`+c("result")+`"}}`))
	serve(effectsid.V1EffectsIdReport, "POST", "/api/v1/effects/id/report?id="+id, root,
		text(`{"lease_token":"`+token+`","outcome":"succeeded","result":{"id":"`+c("result")+`"}}`))
	serve(effects.V1EffectsId, "GET", "/api/v1/effects/id?id="+c("effect")+"&"+c("param")+"=1", root, nil)
	serve(effects.V1EffectsId, "GET", "/api/v1/effects/id?id=%zz"+c("escape"), root, nil)
	serve(v1.V1Effects, "GET", "/api/v1/effects?cursor="+c("cursor"), "rk_live_"+c("badkey"), nil)
	serve(cron.CronSweep, "GET", "/api/cron/sweep", c("cronsecret"), nil)
	serve(effects.V1EffectsBegin, "POST", "/api/v1/effects/begin", root, text(`{"effect_type":"`+c("broken")))
	serve(effects.V1EffectsBegin, "POST", "/api/v1/effects/begin", root, apitest.PanickyBody{V: errors.New(c("panic"))})
	serve(effects.V1EffectsBegin, "POST", "/api/v1/effects/begin", root,
		text(`{"effect_type":"push.send","idempotency_key":"`+c("raiseme")+`"}`))

	require.NoError(t, w.Close())
	<-copied
	apitest.RequireNoLeak(t, logs.String(), []string{root, token}, `"msg":"request"`, `"msg":"panic"`,
		`"msg":"internal error"`, "SQLSTATE P0001")
}
