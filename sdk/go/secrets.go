package ratchet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// The answers that carry a secret (a lease token, a key's or a webhook's
// secret), and the job reports a caller builds with a lease token, print it
// masked: fmt's verbs (%v, %+v, %#v, %s, any other) and
// log/slog (its JSON handler included) show "[redacted]" in its place, so a
// caller that logs or prints one whole does not write the credential. The
// field itself and the value's JSON encoding are unchanged: read the field
// to use it. A value nested in another (a slice of ClaimedJob printed with
// %v) is masked by fmt too, and by slog's text handler (which prints with
// %+v); slog's JSON handler calls LogValue only on an attribute's value (and
// a group's members), and encodes anything else, a []ClaimedJob included,
// with encoding/json, whose output keeps the secret: that limitation cannot
// be closed without changing the JSON (README: log each value as its own
// attribute).

// redactedSecret stands for a secret in printed values: whether one is
// set, never any part of it.
func redactedSecret(s string) string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// mirrorNames names the method-less mirrors below (which %#v and %+v
// print) by the types they stand for.
var mirrorNames = strings.NewReplacer("ratchet.claimedJobFields", "ratchet.ClaimedJob",
	"ratchet.beginResponseFields", "ratchet.BeginResponse", "ratchet.newAPIKeyFields", "ratchet.NewAPIKey",
	"ratchet.rotatedWebhookFields", "ratchet.RotatedWebhook", "ratchet.newWebhookFields", "ratchet.NewWebhook",
	"newWebhookFields:", "NewWebhook:", "ratchet.batchJobReportFields", "ratchet.BatchJobReport",
	"ratchet.jobReportFields", "ratchet.JobReport", "jobReportFields:", "JobReport:")

// formatRedacted prints masked (a method-less copy of a value with its
// secrets masked) for f's verb and flags.
func formatRedacted(f fmt.State, verb rune, masked any) {
	_, _ = f.Write([]byte(mirrorNames.Replace(fmt.Sprintf(fmt.FormatString(f, verb), masked))))
}

// logMasked is masked (a method-less mirror, see formatRedacted) for
// log/slog. Its text handler prints a value with %+v, which named the
// mirrors' embedded fields by their internal types ("jobReportFields:",
// "newWebhookFields:"): the mirror goes through Format's renaming instead,
// as fmt prints it. Its JSON handler encodes the mirror as before.
func logMasked(masked any) slog.Value { return slog.AnyValue(loggedMirror{masked}) }

type loggedMirror struct{ masked any }

func (m loggedMirror) Format(f fmt.State, verb rune) { formatRedacted(f, verb, m.masked) }

func (m loggedMirror) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // as slog's JSON handler encodes
	if err := enc.Encode(m.masked); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

type (
	claimedJobFields     ClaimedJob
	beginResponseFields  BeginResponse
	newAPIKeyFields      NewAPIKey
	newWebhookFields     NewWebhook
	rotatedWebhookFields struct {
		newWebhookFields
		PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	}
	jobReportFields      JobReport
	batchJobReportFields struct {
		JobID string `json:"jobId"`
		jobReportFields
	}
)

func (j ClaimedJob) masked() claimedJobFields {
	j.LeaseToken = redactedSecret(j.LeaseToken)
	return claimedJobFields(j)
}

// Format prints j with its LeaseToken masked (see the package's secrets).
func (j ClaimedJob) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, j.masked())
}

// LogValue is j for log/slog, its LeaseToken masked.
func (j ClaimedJob) LogValue() slog.Value { return logMasked(j.masked()) }

func (b BeginResponse) masked() beginResponseFields {
	b.LeaseToken = redactedSecret(b.LeaseToken)
	return beginResponseFields(b)
}

// Format prints b with its LeaseToken masked.
func (b BeginResponse) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, b.masked())
}

// LogValue is b for log/slog, its LeaseToken masked.
func (b BeginResponse) LogValue() slog.Value { return logMasked(b.masked()) }

func (k NewAPIKey) masked() newAPIKeyFields {
	k.Secret = redactedSecret(k.Secret)
	return newAPIKeyFields(k)
}

// Format prints k with its Secret masked.
func (k NewAPIKey) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, k.masked())
}

// LogValue is k for log/slog, its Secret masked.
func (k NewAPIKey) LogValue() slog.Value { return logMasked(k.masked()) }

func (w NewWebhook) masked() newWebhookFields {
	w.Secret = redactedSecret(w.Secret)
	return newWebhookFields(w)
}

// Format prints w with its signing Secret masked.
func (w NewWebhook) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, w.masked())
}

// LogValue is w for log/slog, its signing Secret masked.
func (w NewWebhook) LogValue() slog.Value { return logMasked(w.masked()) }

func (r RotatedWebhook) masked() rotatedWebhookFields {
	return rotatedWebhookFields{newWebhookFields: r.NewWebhook.masked(), PreviousSecretExpiresAt: r.PreviousSecretExpiresAt}
}

// Format prints r with its new signing Secret masked (it is declared here,
// not promoted from NewWebhook, so PreviousSecretExpiresAt is printed too).
func (r RotatedWebhook) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, r.masked())
}

// LogValue is r for log/slog, its new signing Secret masked.
func (r RotatedWebhook) LogValue() slog.Value { return logMasked(r.masked()) }

func (r JobReport) masked() jobReportFields {
	r.LeaseToken = redactedSecret(r.LeaseToken)
	return jobReportFields(r)
}

// Format prints r with its LeaseToken masked.
func (r JobReport) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, r.masked())
}

// LogValue is r for log/slog, its LeaseToken masked.
func (r JobReport) LogValue() slog.Value { return logMasked(r.masked()) }

func (b BatchJobReport) masked() batchJobReportFields {
	return batchJobReportFields{JobID: b.JobID, jobReportFields: b.JobReport.masked()}
}

// Format prints b with its LeaseToken masked (it is declared here, not
// promoted from JobReport, so JobID is printed too).
func (b BatchJobReport) Format(f fmt.State, verb rune) {
	formatRedacted(f, verb, b.masked())
}

// LogValue is b for log/slog, its LeaseToken masked.
func (b BatchJobReport) LogValue() slog.Value { return logMasked(b.masked()) }
