package httpapi_test

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
)

// listCursorMember is API.md §0 for every list route: its next cursor is
// next_cursor on the effect gate's snake_case routes (§1, §2) and
// nextCursor on the durable-job camelCase routes (§3, queue health).
var listCursorMember = map[string]string{
	"/api/v1/keys":                     "next_cursor",
	"/api/v1/effects":                  "next_cursor",
	"/api/v1/policies":                 "next_cursor",
	"/api/v1/approvals":                "next_cursor",
	"/api/v1/circuits":                 "next_cursor",
	"/api/v1/groups/{id}/steps":        "next_cursor",
	"/api/v1/webhooks":                 "next_cursor",
	"/api/v1/webhooks/{id}/deliveries": "next_cursor",
	"/api/v1/runs":                     "nextCursor",
	"/api/v1/runs/{id}/steps":          "nextCursor",
	"/api/v1/steps/{id}/attempts":      "nextCursor",
	"/api/v1/steps/{id}/replays":       "nextCursor",
	"/api/v1/endpoints":                "nextCursor",
	"/api/v1/endpoints/{id}/attempts":  "nextCursor",
	"/api/v1/tools/{name}/contracts":   "nextCursor",
	"/api/v1/queue/health":             "nextCursor",
}

// TestConformanceEveryListRouteFollowsTheListConventions pins API.md §0 and
// §5 on every list route of the route table (a new one fails here until it
// is classified above): ?limit= outside 1-200 or not an integer is 400
// invalid_request naming limit; 1 and 200 are taken; the answer is
// {"data": [...], <cursor>} with the cursor member of its section and not
// the other; and walking the list one item a page with the cursors it hands
// out reads exactly the items, in the same order, that one page of 200
// reads, ending on a null cursor.
func TestConformanceEveryListRouteFollowsTheListConventions(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1", "send_email@2")
	op := e.ws.Key

	// At least two items on every list.
	for i, k := range []string{"a", "b"} {
		e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op,
			map[string]any{"effect_type": "list.one", "idempotency_key": "plain-" + k})
		e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op,
			map[string]any{"effect_type": "list.two", "idempotency_key": "two-" + k})
		e.Must(http.StatusCreated, "POST", "/api/v1/webhooks", op,
			map[string]any{"url": "https://example.com/h" + k, "events": []string{"run.finished"}})
		e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", op, map[string]any{"name": "ep-" + k})
		e.publish("send_email", map[string]any{"handlerVersion": []string{"1", "2"}[i],
			"inputSchema": map[string]any{}, "outputSchema": map[string]any{}})
	}
	e.Must(http.StatusOK, "PUT", "/api/v1/policies/list.held", op, map[string]any{"mode": "require_approval"})
	for _, k := range []string{"a", "b"} {
		e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op,
			map[string]any{"effect_type": "list.held", "idempotency_key": "held-" + k})
	}
	group := e.Must(http.StatusCreated, "POST", "/api/v1/groups", op, map[string]any{"name": "g"}).JSON()["id"].(string)
	for _, k := range []string{"a", "b"} {
		e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op,
			map[string]any{"effect_type": "list.one", "idempotency_key": "grouped-" + k, "group_id": group})
	}
	hooks := e.Must(http.StatusOK, "GET", "/api/v1/webhooks", op, nil).JSON()["data"].([]any)
	hook := hooks[0].(map[string]any)["id"].(string)
	for range 2 {
		require.NoError(t, events.Record(context.Background(), e.App.Pool, events.Event{WorkspaceID: e.ws.ID,
			Type: events.RunFinished, SubjectID: ids.New(ids.Run), Data: map[string]any{}, At: e.clock.Now()}))
	}
	// Dispatch fans out every workspace's events a batch at a time, in
	// turns: a few calls reach this one's whatever other tests left.
	for range 20 {
		_, err := e.App.Server.Webhooks.Dispatch(context.Background(), e.clock.Now())
		require.NoError(t, err)
		if len(e.Must(http.StatusOK, "GET", "/api/v1/webhooks/"+hook+"/deliveries", op, nil).JSON()["data"].([]any)) == 2 {
			break
		}
	}

	// A step with two attempts and two replays; a second queue (version 2).
	wid := e.register("send_email@1", "send_email@2")
	_, stepID := e.exhausted(wid, map[string]any{"n": 1}, 2)
	for i := range 2 {
		e.Must(http.StatusOK, "POST", "/api/v1/steps/"+stepID+"/replay", op, ack)
		if i == 0 {
			job := e.claim(wid, 1)[0]
			e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "down"}})
		}
	}
	other := e.run()
	e.enqueue(other, map[string]any{"name": "send_email", "version": "2", "input": map[string]any{"n": 2}})
	e.enqueue(other, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 3}})
	e.clock.Add(time.Minute)
	endpoint := e.Must(http.StatusOK, "POST", "/api/v1/endpoints", op, map[string]any{"name": "send_email"}).JSON()["id"].(string)

	paths := map[string]string{
		"/api/v1/groups/{id}/steps":        "/api/v1/groups/" + group + "/steps",
		"/api/v1/webhooks/{id}/deliveries": "/api/v1/webhooks/" + hook + "/deliveries",
		"/api/v1/runs/{id}/steps":          "/api/v1/runs/" + other + "/steps",
		"/api/v1/steps/{id}/attempts":      "/api/v1/steps/" + stepID + "/attempts",
		"/api/v1/steps/{id}/replays":       "/api/v1/steps/" + stepID + "/replays",
		"/api/v1/endpoints/{id}/attempts":  "/api/v1/endpoints/" + endpoint + "/attempts",
		"/api/v1/tools/{name}/contracts":   "/api/v1/tools/send_email/contracts",
	}

	var lists []string
	for _, r := range httpapi.Routes() {
		for _, p := range r.Query {
			if p.Name == "limit" {
				require.Equal(t, "GET", r.Method, r.Pattern)
				lists = append(lists, r.Pattern)
			}
		}
	}
	sort.Strings(lists)
	var want []string
	for p := range listCursorMember {
		want = append(want, p)
	}
	sort.Strings(want)
	require.Equal(t, want, lists, "every list route is classified by its section's cursor member")

	doc := apitest.OpenAPIDoc(t)
	for _, pattern := range lists {
		// The document states the bounds and the default, and names the
		// cursor as the route's own pages do.
		params := map[string]map[string]any{}
		for _, p := range apitest.At(doc, "paths", pattern, "get", "parameters").([]any) {
			p := p.(map[string]any)
			params[p["name"].(string)] = p
		}
		require.Equal(t, map[string]any{"type": "integer", "minimum": 1.0, "maximum": 200.0, "default": 50.0},
			params["limit"]["schema"], pattern)
		for _, p := range []string{"limit", "cursor"} {
			require.Contains(t, params[p]["description"], listCursorMember[pattern], "%s %s", pattern, p)
			require.NotContains(t, params[p]["description"],
				map[string]string{"next_cursor": "nextCursor", "nextCursor": "next_cursor"}[listCursorMember[pattern]],
				"%s %s", pattern, p)
		}

		path := pattern
		if p, ok := paths[pattern]; ok {
			path = p
		}
		member := listCursorMember[pattern]
		otherMember := map[string]string{"next_cursor": "nextCursor", "nextCursor": "next_cursor"}[member]

		for _, bad := range []string{"0", "201", "-1", "abc", "1.5", "", "1e2"} {
			r := e.Must(http.StatusBadRequest, "GET", path+"?limit="+url.QueryEscape(bad), op, nil)
			require.Equal(t, apierr.CodeInvalidRequest, r.ErrorCode(), "%s limit=%q", pattern, bad)
			require.Equal(t, []string{"limit"}, validationFields(t, r), "%s limit=%q", pattern, bad)
		}

		// One answer names every parameter at fault, the cursor checked
		// with the rest (QA: each list named them one at a time).
		r := e.Must(http.StatusBadRequest, "GET", path+"?limit=0&cursor="+url.QueryEscape("not a cursor!"), op, nil)
		require.Equal(t, []string{"cursor", "limit"}, validationFields(t, r), pattern)

		all := e.Must(http.StatusOK, "GET", path+"?limit=200", op, nil).JSON()
		require.ElementsMatch(t, []string{"data", member}, keysOf(all), "%s: %v", pattern, keysOf(all))
		require.NotContains(t, all, otherMember, pattern)
		require.Nil(t, all[member], "%s: everything fits one page of 200", pattern)
		items := all["data"].([]any)
		require.GreaterOrEqual(t, len(items), 2, "%s lists at least two items here", pattern)

		var walked []any
		cursor := ""
		for pages := 0; ; pages++ {
			require.LessOrEqual(t, pages, len(items), "%s pages past its items", pattern)
			q := "?limit=1"
			if cursor != "" {
				q += "&cursor=" + url.QueryEscape(cursor)
			}
			page := e.Must(http.StatusOK, "GET", path+q, op, nil).JSON()
			require.ElementsMatch(t, []string{"data", member}, keysOf(page), pattern)
			data := page["data"].([]any)
			require.Len(t, data, 1, "%s%s", pattern, q)
			walked = append(walked, data...)
			next, more := page[member].(string)
			if !more {
				require.Nil(t, page[member], pattern)
				break
			}
			require.NotEmpty(t, next, pattern)
			cursor = next
		}
		require.Equal(t, items, walked, "%s: pages of one read the list of 200, in its order", pattern)
		require.False(t, strings.Contains(path, "{"), path)
	}
}

// API.md §0: a list without ?limit= answers 50 items and the cursor to the
// rest, on a snake_case route (effects) and a camelCase one (runs) alike.
func TestConformanceListLimitDefaultsToFifty(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	for i := range 51 {
		e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", e.ws.Key,
			map[string]any{"effect_type": "list.default", "idempotency_key": "k" + strconv.Itoa(i)})
		e.run()
	}
	for path, member := range map[string]string{"/api/v1/effects": "next_cursor", "/api/v1/runs": "nextCursor"} {
		first := e.Must(http.StatusOK, "GET", path, e.ws.Key, nil).JSON()
		require.Equal(t, 50, len(first["data"].([]any)), path)
		next, ok := first[member].(string)
		require.True(t, ok, "%s: %v", path, first[member])
		rest := e.Must(http.StatusOK, "GET", path+"?cursor="+url.QueryEscape(next), e.ws.Key, nil).JSON()
		require.Equal(t, 1, len(rest["data"].([]any)), path)
		require.Nil(t, rest[member], path)
	}
}

// API.md leaves a list's order to the project, to be documented in the
// OpenAPI document (API.md, preamble): every list route's summary says its
// order (keys, policies, circuits, webhooks and endpoints said nothing), and
// those five keep it: keys, webhooks and endpoints oldest first, policies
// and circuits by effect type.
func TestConformanceListsStateAndKeepTheirOrder(t *testing.T) {
	t.Parallel()
	for _, r := range httpapi.Routes() {
		if _, ok := listCursorMember[r.Pattern]; ok && r.Method == "GET" {
			s := strings.ToLower(r.Summary)
			require.True(t, strings.Contains(s, "newest first") || strings.Contains(s, "oldest first") ||
				strings.Contains(s, " order") || strings.Contains(s, "by ascending"), "%s says no order: %s", r.Pattern, r.Summary)
		}
	}

	e := newJobsEnv(t)
	op := e.ws.Key
	for _, name := range []string{"b", "a", "c"} {
		e.clock.Add(time.Millisecond) // ids are time-ordered to the millisecond
		e.Key(e.ws, map[string]any{"name": name, "preset": "AGENT"})
		e.Must(http.StatusCreated, "POST", "/api/v1/webhooks", op,
			map[string]any{"url": "https://example.com/" + name, "events": []string{"run.finished"}})
		e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", op, map[string]any{"name": "ep-" + name})
		e.Must(http.StatusOK, "PUT", "/api/v1/policies/order."+name, op, map[string]any{"mode": "allow"})
	}
	field := func(path, f string) []string {
		var out []string
		for _, it := range e.Must(http.StatusOK, "GET", path+"?limit=200", op, nil).JSON()["data"].([]any) {
			out = append(out, it.(map[string]any)[f].(string))
		}
		return out
	}
	for path, f := range map[string]string{"/api/v1/keys": "id", "/api/v1/webhooks": "id", "/api/v1/endpoints": "id",
		"/api/v1/policies": "effect_type", "/api/v1/circuits": "effect_type"} {
		got := field(path, f)
		require.True(t, sort.StringsAreSorted(got), "%s by %s: %v", path, f, got)
	}
	names := func(path, f string) []string {
		var out []string
		for _, v := range field(path, f) {
			if strings.HasSuffix(v, "a") || strings.HasSuffix(v, "b") || strings.HasSuffix(v, "c") {
				out = append(out, v[len(v)-1:])
			}
		}
		return out
	}
	require.Equal(t, []string{"b", "a", "c"}, names("/api/v1/endpoints", "name"), "oldest first")
	require.Equal(t, []string{"b", "a", "c"}, names("/api/v1/webhooks", "url"), "oldest first")
	require.Equal(t, []string{"a", "b", "c"}, names("/api/v1/policies", "effect_type"), "by effect type")
}

// A list's filters are checked with its limit and cursor, in one place for
// every route (knownQuery): one answer names each one at fault, in the
// words the list's own check uses (QA: ?outcome=RUNNING&cursor=bad named
// outcome only, and the cursor was refused once outcome was fixed).
func TestAListNamesEveryQueryParameterAtFault(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t, "send_email@1")
	op := e.ws.Key
	endpoint := e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", op, map[string]any{"name": "ep"}).JSON()["id"].(string)
	run := e.run()
	for query, want := range map[string]map[string]string{
		"/api/v1/endpoints/" + endpoint + "/attempts?outcome=RUNNING&cursor=bad": {
			"outcome": "must be SUCCEEDED or FAILED", "cursor": "is not a cursor from this API"},
		"/api/v1/runs?status=DONE&cursor=stp_x&limit=x": {"status": "must be RUNNING, SUCCEEDED or FAILED",
			"cursor": "is not a cursor from this API", "limit": apierr.LimitRule},
		"/api/v1/runs/" + run + "/steps?status=DONE&limit=201": {"status": jobs.StatusRule, "limit": apierr.LimitRule},
		"/api/v1/effects?state=done&effect_type=%21&cursor=x&limit=0": {"state": gate.ListStateRule,
			"effect_type": gate.ListEffectTypeRule, "cursor": "is not a cursor from this API", "limit": apierr.LimitRule},
		"/api/v1/approvals?state=done&cursor=x": {"state": "must be pending, approved or rejected",
			"cursor": "is not a cursor from this API"},
		"/api/v1/keys?created_by=nope&cursor=x": {"created_by": "must be a key id (key_ and 26 characters)",
			"cursor": "is not a cursor from this API"},
	} {
		r := e.Must(http.StatusBadRequest, "GET", query, op, nil)
		require.Equal(t, apierr.CodeInvalidRequest, r.ErrorCode(), query)
		got := map[string]string{}
		for _, v := range r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any) {
			v := v.(map[string]any)
			got[v["field"].(string)] = v["message"].(string)
		}
		require.Equal(t, want, got, query)
	}
}
