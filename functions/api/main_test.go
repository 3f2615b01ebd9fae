package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A Lambda instance whose configuration cannot start answers every request
// in the API's envelope, naming no value (QA: the process exited, and each
// request got the Function URL's bare 502); the build is tried again by
// later requests (app.Default).
func TestServeAnswersAFailedStartInTheEnvelope(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("KEY_HASH_SECRET", "")
	t.Setenv("RESULT_ENCRYPTION_KEY", "")
	rec := httptest.NewRecorder()
	serve(rec, httptest.NewRequest("GET", "/api/v1/effects", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var body struct {
		Error struct {
			Code   string         `json:"code"`
			Detail map[string]any `json:"detail"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	if body.Error.Code != "internal_error" || body.Error.Detail["request_id"] != rec.Header().Get("X-Request-Id") {
		t.Fatalf("answered %s", rec.Body)
	}
	if strings.Contains(rec.Body.String(), "DATABASE_URL") {
		t.Fatalf("the answer names a setting; the log does: %s", rec.Body)
	}
}
