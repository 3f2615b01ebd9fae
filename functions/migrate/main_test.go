package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/testpg"
)

var clusterURL string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	cluster, err := testpg.Provision(context.Background(), testpg.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate test:", err)
		return 1
	}
	defer cluster.Close()
	clusterURL = cluster.URL
	return m.Run()
}

// freshDatabase is an empty database, dropped after the test.
func freshDatabase(t *testing.T) string {
	t.Helper()
	name := testpg.TestDatabaseName(time.Now())
	url, err := testpg.CreateDatabase(t.Context(), clusterURL, name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = testpg.DropDatabase(context.Background(), clusterURL, name) })
	return url
}

// cloudFormation stands in for the pre-signed URL a custom resource
// answers: it keeps each response body.
type cloudFormation struct {
	*httptest.Server
	mu        sync.Mutex
	responses []map[string]any
}

func newCloudFormation(t *testing.T) *cloudFormation {
	cf := &cloudFormation{}
	cf.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var resp map[string]any
		if r.Method != http.MethodPut || json.Unmarshal(body, &resp) != nil {
			http.Error(w, "want a PUT of JSON", http.StatusBadRequest)
			return
		}
		cf.mu.Lock()
		cf.responses = append(cf.responses, resp)
		cf.mu.Unlock()
	}))
	t.Cleanup(cf.Close)
	return cf
}

func (cf *cloudFormation) last(t *testing.T) map[string]any {
	t.Helper()
	cf.mu.Lock()
	defer cf.mu.Unlock()
	require.NotEmpty(t, cf.responses, "CloudFormation was not answered")
	return cf.responses[len(cf.responses)-1]
}

// invoke sends an event of requestType whose Version property names
// version and, for an update from another version, OldResourceProperties
// naming old.
func (cf *cloudFormation) invoke(t *testing.T, requestType, version string, old ...string) {
	t.Helper()
	arn := func(n string) string { return "arn:aws:lambda:eu-west-1:123456789012:function:migrate:" + n }
	event := map[string]any{
		"RequestType": requestType, "RequestId": "req-1", "ResponseURL": cf.URL + "/answer",
		"ResourceType": "Custom::Migrations", "LogicalResourceId": "Migrations", "StackId": "stack-1",
		"PhysicalResourceId": physicalID, "ResourceProperties": map[string]any{"ServiceToken": "arn:x",
			"Version": arn(version)},
	}
	if len(old) > 0 {
		event["OldResourceProperties"] = map[string]any{"ServiceToken": "arn:x", "Version": arn(old[0])}
	}
	ev, _ := json.Marshal(event)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := handle(ctx, ev)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"answered": requestType}, out)
}

func migrated(t *testing.T, url string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		return 0 // no table: nothing applied
	}
	return n
}

// A deploy's Create and Update apply the migrations before CloudFormation
// goes on to the API, and say so through the ResponseURL; a rollback to an
// older release (an update naming another version than the running one)
// and a Delete succeed without touching the database.
func TestTheCustomResourceMigratesDuringTheDeploy(t *testing.T) {
	url := freshDatabase(t)
	t.Setenv("MIGRATION_DATABASE_URL", url)
	t.Setenv("AWS_LAMBDA_FUNCTION_VERSION", "7")
	cf := newCloudFormation(t)

	cf.invoke(t, "Create", "7")
	resp := cf.last(t)
	require.Equal(t, "SUCCESS", resp["Status"], "%v", resp)
	require.Equal(t, physicalID, resp["PhysicalResourceId"])
	total := migrated(t, url)
	require.Positive(t, total)
	require.EqualValues(t, total, resp["Data"].(map[string]any)["Applied"])

	cf.invoke(t, "Update", "7")
	require.Equal(t, "SUCCESS", cf.last(t)["Status"])
	require.EqualValues(t, 0, cf.last(t)["Data"].(map[string]any)["Applied"], "nothing pending")

	// A database that cannot be reached: the forward update fails the
	// deploy, and the rollback (the old version) and the delete succeed.
	t.Setenv("MIGRATION_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	cf.invoke(t, "Update", "7")
	resp = cf.last(t)
	require.Equal(t, "FAILED", resp["Status"])
	require.Contains(t, resp["Reason"], "migrate:")
	cf.invoke(t, "Update", "7", "6")
	require.Equal(t, "FAILED", cf.last(t)["Status"], "an update from an older release migrates")
	// A rollback: to an older version than the update it undoes, answered
	// by the older code (the alias went back first) or by the newer.
	t.Setenv("AWS_LAMBDA_FUNCTION_VERSION", "6")
	cf.invoke(t, "Update", "6", "7")
	require.Equal(t, "SUCCESS", cf.last(t)["Status"], "a rollback, answered by the older version")
	t.Setenv("AWS_LAMBDA_FUNCTION_VERSION", "7")
	cf.invoke(t, "Update", "6", "7")
	require.Equal(t, "SUCCESS", cf.last(t)["Status"], "a rollback, answered by the newer version")
	// A forward deploy answered by another version than its own would
	// apply another release's migrations: it fails (review: it succeeded
	// without migrating).
	t.Setenv("MIGRATION_DATABASE_URL", url)
	t.Setenv("AWS_LAMBDA_FUNCTION_VERSION", "6")
	for _, old := range [][]string{{"6"}, nil} {
		requestType := "Update"
		if old == nil {
			requestType = "Create"
		}
		cf.invoke(t, requestType, "8", old...)
		resp = cf.last(t)
		require.Equal(t, "FAILED", resp["Status"], requestType)
		require.Contains(t, resp["Reason"], "version 6 answered")
	}
	cf.invoke(t, "Delete", "7")
	require.Equal(t, "SUCCESS", cf.last(t)["Status"])
	require.Equal(t, physicalID, cf.last(t)["PhysicalResourceId"])
}

// A response CloudFormation refuses is the invocation's error, so that
// Lambda retries it (an asynchronous invocation) rather than leave the
// stack waiting.
func TestAnUnansweredRequestIsAnError(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "expired", http.StatusForbidden)
	}))
	defer refusing.Close()
	ev, _ := json.Marshal(map[string]any{"RequestType": "Delete", "RequestId": "req-1",
		"ResponseURL": refusing.URL, "LogicalResourceId": "Migrations", "StackId": "stack-1",
		"PhysicalResourceId": physicalID})
	_, err := handle(t.Context(), ev)
	require.ErrorContains(t, err, "answer CloudFormation")
}

// CloudFormation's ResponseURL is pre-signed: its query is a credential
// that can answer for the stack until it expires. An answer that could not
// be sent is the invocation's error, which the Lambda runtime logs: it
// names the URL without its query (logs QA: the HTTP client's error carried
// the whole URL, X-Amz-Signature and X-Amz-Credential included).
func TestAnUnansweredRequestDoesNotLogTheSignedURL(t *testing.T) {
	const marker = "SECRET-MARKER-123"
	ev, _ := json.Marshal(map[string]any{"RequestType": "Delete", "RequestId": "req-1",
		"ResponseURL":       "http://127.0.0.1:1/answer?X-Amz-Credential=" + marker + "&X-Amz-Signature=" + marker,
		"LogicalResourceId": "Migrations", "StackId": "stack-1", "PhysicalResourceId": physicalID})
	_, err := handle(t.Context(), ev)
	require.ErrorContains(t, err, "answer CloudFormation")
	require.ErrorContains(t, err, `"http://127.0.0.1:1/answer?…"`)
	require.NotContains(t, err.Error(), marker)
}

// Invoked by hand (any event that is not CloudFormation's), it migrates
// and answers what it applied.
func TestAnInvocationByHandMigrates(t *testing.T) {
	url := freshDatabase(t)
	t.Setenv("MIGRATION_DATABASE_URL", url)
	out, err := handle(t.Context(), json.RawMessage(`{}`))
	require.NoError(t, err)
	require.Len(t, out.(Result).Applied, migrated(t, url))
	require.Positive(t, migrated(t, url))
}

func TestVersionNumber(t *testing.T) {
	n, ok := versionNumber("arn:aws:lambda:eu-west-1:1:function:m:12")
	require.True(t, ok)
	require.Equal(t, 12, n)
	for _, v := range []any{nil, "", "arn:aws:lambda:eu-west-1:1:function:m:live", 12} {
		_, ok := versionNumber(v)
		require.False(t, ok, "%v", v)
	}
}

func TestOwnVersion(t *testing.T) {
	t.Setenv("AWS_LAMBDA_FUNCTION_VERSION", "12")
	require.True(t, ownVersion("arn:aws:lambda:eu-west-1:1:function:m:12"))
	require.False(t, ownVersion("arn:aws:lambda:eu-west-1:1:function:m:1"))
	require.True(t, ownVersion(nil), "a template that passes none")
	t.Setenv("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
	require.True(t, ownVersion("arn:aws:lambda:eu-west-1:1:function:m:1"), "an unpublished function")
}

// template.yaml gives each function exactly the secrets (the NoEcho
// parameters) it reads, and no other: SAM merges Globals into every
// function, so a secret there reached every one (AL review: the migrate
// function, which reads the database URLs alone, held KEY_HASH_SECRET, the
// RESULT_ENCRYPTION_KEYs, CRON_SECRET and SIGNUP_TOKEN). MIGRATION_DATABASE_URL,
// whose role may change the schema, goes to the migrate function alone:
// the API, the sweeper and reseal read DATABASE_URL only (without
// AUTO_MIGRATE, which the template does not set), and the public API
// function held the direct URL for nothing (deploy review: it was a
// Global). The API, the sweeper and reseal start through lib/config, which
// requires KEY_HASH_SECRET and RESULT_ENCRYPTION_KEY; CRON_SECRET and
// signup's settings are read by the API's routes alone, and SIGNUP_MODE
// goes with SIGNUP_TOKEN (token mode without one refuses to start).
func TestTemplateGivesEachFunctionTheSecretsItReads(t *testing.T) {
	b, err := os.ReadFile("../../template.yaml")
	require.NoError(t, err)
	tmpl := string(b)
	// section is a top-level key's body; blocks, a section's two-space
	// indented keys and their bodies.
	section := func(name string) string {
		_, body, ok := strings.Cut(tmpl, "\n"+name+":\n")
		require.True(t, ok, name)
		if end := regexp.MustCompile(`(?m)^\S`).FindStringIndex(body); end != nil {
			body = body[:end[0]]
		}
		return body
	}
	blocks := func(body string) map[string]string {
		out := map[string]string{}
		starts := regexp.MustCompile(`(?m)^  ([A-Za-z]+):\n`).FindAllStringSubmatchIndex(body, -1)
		for i, m := range starts {
			end := len(body)
			if i+1 < len(starts) {
				end = starts[i+1][0]
			}
			out[body[m[2]:m[3]]] = body[m[1]:end]
		}
		return out
	}
	secret := map[string]bool{} // the NoEcho parameters
	for name, body := range blocks(section("Parameters")) {
		secret[name] = regexp.MustCompile(`(?m)^    NoEcho: true$`).MatchString(body)
	}
	variable := regexp.MustCompile(`(?m)^ +([A-Z_]+): !Ref ([A-Za-z]+)$`)
	variables := func(body string) map[string]string {
		out := map[string]string{}
		for _, m := range variable.FindAllStringSubmatch(body, -1) {
			out[m[1]] = m[2]
		}
		return out
	}
	globals := variables(section("Globals"))
	given := map[string][]string{}
	for name, body := range blocks(section("Resources")) {
		if !strings.HasPrefix(body, "    Type: AWS::Serverless::Function\n") {
			continue
		}
		env := variables(body)
		for k, v := range globals {
			env[k] = v
		}
		_, mode := env["SIGNUP_MODE"]
		_, token := env["SIGNUP_TOKEN"]
		require.Equal(t, token, mode, "%s: SIGNUP_MODE goes with SIGNUP_TOKEN", name)
		given[name] = []string{}
		for k, param := range env {
			if secret[param] {
				given[name] = append(given[name], k)
			}
		}
		slices.Sort(given[name])
	}
	started := []string{"DATABASE_URL", "KEY_HASH_SECRET", "RESULT_ENCRYPTION_KEY", "RESULT_ENCRYPTION_KEYS"}
	require.Equal(t, map[string][]string{
		"ApiFunction": {"CRON_SECRET", "DATABASE_URL", "KEY_HASH_SECRET", "RESULT_ENCRYPTION_KEY",
			"RESULT_ENCRYPTION_KEYS", "SIGNUP_TOKEN"},
		"SweeperFunction": started,
		"ResealFunction":  started,
		"MigrateFunction": {"DATABASE_URL", "MIGRATION_DATABASE_URL"},
	}, given)
}
