package apitest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// Tee sends r through next and hands its answer, with the request's body and
// its own, to see before the caller reads it (the bodies are read whole and
// handed on unchanged); a transport error goes to failed instead. Tests that
// hold a service to what it acknowledged under chaos or crashes record the
// answers their SDK clients saw with it, in a RoundTrip of their own.
func Tee(next http.RoundTripper, r *http.Request, see func(r *http.Request, reqBody []byte, res *http.Response,
	body []byte), failed func(error)) (*http.Response, error) {
	var reqBody []byte
	if r.Body != nil {
		reqBody, _ = io.ReadAll(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	res, err := next.RoundTrip(r)
	if err != nil {
		failed(err)
		return res, err
	}
	body, rerr := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(body))
	if rerr == nil {
		see(r, reqBody, res, body)
	}
	return res, nil
}

// JobAttempt names one attempt of a job.
type JobAttempt struct {
	JobID   string
	Attempt int
}

// AcknowledgedJobReports are the attempts a job report's 2xx answer says
// were recorded: the single route's, or each of a batch's items answered
// without an error. An answer that does not read as either names none.
func AcknowledgedJobReports(body []byte) []JobAttempt {
	var a struct {
		JobID   string `json:"jobId"`
		Attempt int    `json:"attempt"`
		Results []struct {
			JobID   string          `json:"jobId"`
			Attempt int             `json:"attempt"`
			Error   json.RawMessage `json:"error"`
		} `json:"results"`
	}
	if json.Unmarshal(body, &a) != nil {
		return nil
	}
	var out []JobAttempt
	if a.JobID != "" {
		out = append(out, JobAttempt{a.JobID, a.Attempt})
	}
	for _, r := range a.Results {
		if len(r.Error) == 0 || string(r.Error) == "null" {
			out = append(out, JobAttempt{r.JobID, r.Attempt})
		}
	}
	return out
}
