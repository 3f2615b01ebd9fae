package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
)

// answerTimeout bounds the PUT of a custom resource's answer; the
// pre-signed URL is S3's and answers in well under a second.
const answerTimeout = 30 * time.Second

// answerBodyLimit is how much of a refused answer's body is read (and
// thrown away) so the connection can be reused.
const answerBodyLimit = 64 << 10

// respond runs fn for a custom resource event and answers CloudFormation
// through the event's pre-signed ResponseURL, as cfn.LambdaWrap does, with
// two differences that keep secrets out of the log (logs QA): a refused
// answer's body (S3's error, which may quote the signed request's
// credential and string to sign) is never logged, nor is fn's error text
// (deploy logs its own, redacted); and a panic in fn is answered FAILED
// with its stack logged, not its value.
func respond(ctx context.Context, ev cfn.Event, fn cfn.CustomResourceFunction) error {
	r := cfn.NewResponse(&ev)
	// A previous physical id exists unless this is a create request, whose
	// fallback is the request's id (CloudFormation's own convention).
	fallbackID := ev.PhysicalResourceID
	if ev.RequestType == cfn.RequestCreate {
		fallbackID = ev.RequestID
	}
	var err error
	r.PhysicalResourceID, r.Data, err = call(ctx, ev, fn)
	if r.PhysicalResourceID == "" {
		r.PhysicalResourceID = fallbackID
	}
	r.Status = cfn.StatusSuccess
	if err != nil {
		r.Status, r.Reason, r.Data = cfn.StatusFailed, err.Error(), nil
	}
	return put(ctx, ev.ResponseURL, r)
}

// call runs fn, turning a panic into an error whose text names no value.
func call(ctx context.Context, ev cfn.Event, fn cfn.CustomResourceFunction) (id string, data map[string]any, err error) {
	defer func() {
		if p := recover(); p != nil {
			log.Printf("migrate: panic (value withheld)\n%s", debug.Stack())
			id, data, err = "", nil, fmt.Errorf("the function panicked; its log has the stack")
		}
	}()
	return fn(ctx, ev)
}

// put sends the answer. CloudFormation's URL is pre-signed without a
// content type, so none is sent.
func put(ctx context.Context, url string, r *cfn.Response) error {
	body, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode the answer: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), answerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build the answer: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, answerBodyLimit))
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("the answer was refused with status %d", res.StatusCode)
	}
	return nil
}
