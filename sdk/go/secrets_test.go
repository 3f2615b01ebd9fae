package ratchet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The answers that carry a secret print it masked whatever the verb or
// logger, while the field and the JSON encoding keep it.
func TestSecretBearingAnswersPrintTheirSecretsMasked(t *testing.T) {
	const secret = "s3cr3t-value-never-printed"
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	values := map[string]any{
		"ClaimedJob":     ClaimedJob{JobID: "job_1", LeaseToken: secret, Input: json.RawMessage(`{"a":1}`)},
		"BeginResponse":  BeginResponse{Decision: DecisionExecute, EffectID: "eff_1", LeaseToken: secret},
		"NewAPIKey":      NewAPIKey{APIKey: APIKey{ID: "key_1", Name: "ci"}, Secret: secret},
		"NewWebhook":     NewWebhook{Webhook: Webhook{ID: "wh_1", URL: "https://example.test/hook"}, Secret: secret},
		"RotatedWebhook": RotatedWebhook{NewWebhook: NewWebhook{Webhook: Webhook{ID: "wh_1"}, Secret: secret}, PreviousSecretExpiresAt: &at},
		"JobReport":      JobReport{LeaseToken: secret, Status: ReportSucceeded, Output: json.RawMessage(`{"a":1}`)},
		"BatchJobReport": BatchJobReport{JobID: "job_1", JobReport: JobReport{LeaseToken: secret, Status: ReportFailed,
			Error: &JobError{Message: "boom", Retryable: true}}},
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			var printed []string
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
				printed = append(printed, fmt.Sprintf(verb, v))
			}
			// Behind a pointer and inside a slice too.
			ptr := reflect.New(reflect.TypeOf(v))
			ptr.Elem().Set(reflect.ValueOf(v))
			printed = append(printed, fmt.Sprintf("%+v", []any{v}), fmt.Sprintf("%+v", ptr.Interface()))
			var text, js bytes.Buffer
			slog.New(slog.NewTextHandler(&text, nil)).Info("got", "answer", v)
			slog.New(slog.NewJSONHandler(&js, nil)).Info("got", "answer", v)
			printed = append(printed, text.String(), js.String())
			for _, out := range printed {
				if strings.Contains(out, secret) || strings.Contains(out, fmt.Sprintf("%x", secret)) {
					t.Errorf("printed the secret: %s", out)
				}
			}
			if got := fmt.Sprintf("%+v", v); !strings.Contains(got, "[redacted]") {
				t.Errorf("%%+v = %s, want the secret's place marked [redacted]", got)
			}
			if got := fmt.Sprintf("%#v", v); !strings.HasPrefix(got, "ratchet."+name+"{") || strings.Contains(got, "Fields") {
				t.Errorf("%%#v = %s, want it named ratchet.%s", got, name)
			}
			if strings.Contains(text.String(), "Fields") {
				t.Errorf("slog text = %s, want the public types' names, not the internal mirrors'", text.String())
			}
			if !strings.Contains(js.String(), "[redacted]") {
				t.Errorf("slog JSON = %s, want the secret's place marked [redacted]", js.String())
			}
			raw, err := json.Marshal(v)
			if err != nil || !strings.Contains(string(raw), `"`+secret+`"`) {
				t.Errorf("json.Marshal = %s, %v: want the secret kept", raw, err)
			}
		})
	}
	r := values["RotatedWebhook"].(RotatedWebhook)
	if got := fmt.Sprintf("%+v", r); !strings.Contains(got, "PreviousSecretExpiresAt:") || !strings.Contains(got, "ID:wh_1") {
		t.Errorf("%%+v of a RotatedWebhook = %s, want its own fields and its subscription's", got)
	}
	b := values["BatchJobReport"].(BatchJobReport)
	for _, got := range []string{fmt.Sprintf("%v", b), fmt.Sprintf("%+v", b), fmt.Sprintf("%#v", b)} {
		if !strings.Contains(got, "job_1") || !strings.Contains(got, "FAILED") {
			t.Errorf("a BatchJobReport printed %s, want its JobID and its report's fields", got)
		}
	}
	var text bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("got", "report", b, "rotated", r)
	for _, want := range []string{"JobID:job_1 JobReport:{LeaseToken:[redacted] Status:FAILED", "NewWebhook:{Webhook:{ID:wh_1", "PreviousSecretExpiresAt:"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("slog text of a BatchJobReport and a RotatedWebhook = %s, want %s", text.String(), want)
		}
	}
	var js bytes.Buffer
	slog.New(slog.NewJSONHandler(&js, nil)).Info("got", "report", b, "message", BatchJobReport{JobReport: JobReport{
		Error: &JobError{Message: "<a&b>"}}})
	if !strings.Contains(js.String(), `"jobId":"job_1"`) || !strings.Contains(js.String(), `"status":"FAILED"`) {
		t.Errorf("slog JSON of a BatchJobReport = %s, want its jobId and status", js.String())
	}
	if !strings.Contains(js.String(), `"message":"<a&b>"`) {
		t.Errorf("slog JSON of a BatchJobReport = %s, want its text unescaped, as slog writes it", js.String())
	}
	// The README's workarounds for slog's JSON handler, which encodes a
	// slice of them with encoding/json (the API's JSON, the token kept):
	// each value as its own attribute, a group of them, or a pointer.
	job := values["ClaimedJob"].(ClaimedJob)
	var nested, workaround bytes.Buffer
	slog.New(slog.NewJSONHandler(&nested, nil)).Info("got", "jobs", []ClaimedJob{job})
	if !strings.Contains(nested.String(), secret) {
		t.Errorf("slog JSON of a []ClaimedJob = %s: masked, so the README's limitation is gone; say so there", nested.String())
	}
	slog.New(slog.NewJSONHandler(&workaround, nil)).Info("got", "job", job, slog.Group("jobs", slog.Any("0", job)), "ptr", &job)
	if strings.Contains(workaround.String(), secret) || strings.Count(workaround.String(), "[redacted]") != 3 {
		t.Errorf("slog JSON of the README's workarounds = %s, want each token [redacted]", workaround.String())
	}
	var empty ClaimedJob
	if got := fmt.Sprintf("%+v", empty); strings.Contains(got, "[redacted]") {
		t.Errorf("%%+v of a job without a token = %s, want no token marked", got)
	}
}
