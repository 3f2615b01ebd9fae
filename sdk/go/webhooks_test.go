package ratchet

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// webhookVectors is ../webhook_vectors.json, which the server's tests
// (lib/webhooks: Sign) and the three SDKs' tests share.
type webhookVectors struct {
	Signed []struct {
		Name    string
		T       int64
		Body    string
		Secrets []string
		Header  string
	}
	Verify []struct {
		Name, Secret, Header, Body string
		BodyBase64                 []byte `json:"body_base64"` // bytes that are not UTF-8, in place of Body
		Now, Tolerance             float64
		Outcome, Reason, ID        string
	}
}

// The shared vectors: what the server signs verifies with each of its
// secrets, and each header, body, secret, clock and tolerance is answered
// as the Python and TypeScript SDKs answer it.
func TestVerifyWebhookSharedVectors(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../webhook_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file webhookVectors
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Signed) == 0 || len(file.Verify) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range file.Signed {
		for _, secret := range v.Secrets {
			if _, err := VerifyWebhookAt(secret, v.Header, []byte(v.Body), 0, time.Unix(v.T, 0)); err != nil {
				t.Errorf("%s: with %s: %v", v.Name, secret, err)
			}
		}
	}
	const prefix = "ratchet: webhook signature does not verify: "
	for _, v := range file.Verify {
		whole, frac := math.Modf(v.Now)
		now := time.Unix(int64(whole), int64(math.Round(frac*1e9)))
		tolerance := time.Duration(v.Tolerance * float64(time.Second))
		body := []byte(v.Body)
		if v.BodyBase64 != nil {
			body = v.BodyBase64
		}
		ev, err := VerifyWebhookAt(v.Secret, v.Header, body, tolerance, now)
		var got string
		switch {
		case err == nil:
			got = "ok"
			if ev.ID != v.ID {
				t.Errorf("%s: event id %q, want %q", v.Name, ev.ID, v.ID)
			}
		case errors.Is(err, ErrNoWebhookSecret):
			got = "no_secret"
		case errors.Is(err, ErrWebhookSignature):
			got = "signature"
			if reason := strings.TrimPrefix(err.Error(), prefix); reason != v.Reason {
				t.Errorf("%s: reason %q, want %q", v.Name, reason, v.Reason)
			}
		default:
			got = "decode"
		}
		if got != v.Outcome {
			t.Errorf("%s: %s (%v), want %s", v.Name, got, err, v.Outcome)
		}
	}
}

// UpdateWebhook sends only what it sets: a nil field is left out (kept by
// the server), an empty Events list is sent (and refused by the server),
// and false is sent, not dropped.
func TestUpdateWebhookSendsWhatItSets(t *testing.T) {
	t.Parallel()
	var got []string
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.EscapedPath()+" "+string(body))
		writeJSON(w, 200, map[string]any{"id": "whk_1", "url": "https://example.com/h", "events": []string{"run.finished"},
			"disabled": true, "disabled_at": "2030-01-01T00:00:00Z"})
	}))
	ctx := context.Background()
	off, on, url := true, false, "https://example.com/h"
	w, err := c.UpdateWebhook(ctx, "whk/1", WebhookUpdate{Disabled: &off})
	if err != nil {
		t.Fatal(err)
	}
	if !w.Disabled || w.DisabledAt == nil || !w.DisabledAt.Equal(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("answer %+v", w)
	}
	for _, u := range []WebhookUpdate{{Disabled: &on}, {URL: &url, Events: []string{"run.finished"}}, {Events: []string{}}} {
		if _, err := c.UpdateWebhook(ctx, "whk/1", u); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`PATCH /api/v1/webhooks/whk%2F1 {"disabled":true}`,
		`PATCH /api/v1/webhooks/whk%2F1 {"disabled":false}`,
		`PATCH /api/v1/webhooks/whk%2F1 {"url":"https://example.com/h","events":["run.finished"]}`,
		`PATCH /api/v1/webhooks/whk%2F1 {"events":[]}`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("sent\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// WebhookHandler reads every line of a repeated Ratchet-Signature header,
// joined as the TypeScript SDK (Node) and the Python SDK (a list of lines)
// join them: two signatures as two lines are two t, refused as ambiguous
// (it read the first line only and verified it), and a t and a v1 on lines
// of their own verify.
func TestWebhookHandlerReadsEveryLineOfTheSignature(t *testing.T) {
	t.Parallel()
	const secret = "whsec_lines"
	body := []byte(`{"id":"evt_1","type":"run.finished","created_at":"2030-01-01T00:00:00Z","workspace_id":"ws_1","subject_id":"run_1","data":{}}`)
	sign := func(ts int64) (string, string) {
		m := hmac.New(sha256.New, []byte(secret))
		fmt.Fprintf(m, "%d.%s", ts, body)
		return "t=" + strconv.FormatInt(ts, 10), "v1=" + hex.EncodeToString(m.Sum(nil))
	}
	now := time.Now().Unix()
	t1, v1 := sign(now)
	t2, v2 := sign(now - 1)
	handled := 0
	h := WebhookHandler(secret, func(context.Context, *WebhookEvent) error { handled++; return nil })
	for _, c := range []struct {
		lines []string
		want  int
	}{
		{[]string{t1 + "," + v1}, http.StatusNoContent},
		{[]string{t1 + "," + v1, t2 + "," + v2}, http.StatusUnauthorized},
		{[]string{t1, v1}, http.StatusNoContent},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		for _, line := range c.lines {
			r.Header.Add(WebhookSignatureHeader, line)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("lines %q: %d, want %d", c.lines, w.Code, c.want)
		}
	}
	if handled != 2 {
		t.Fatalf("handled %d deliveries, want 2", handled)
	}
}
