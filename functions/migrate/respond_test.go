package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/stretchr/testify/require"
)

// captureLog gathers what the standard logger prints during the test.
func captureLog(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	prev := log.Writer()
	log.SetOutput(&buf)
	t.Cleanup(func() { log.SetOutput(prev) })
	return &buf
}

// S3 answers a refused pre-signed PUT with an XML error that may quote the
// signed request (its credential and string to sign): the refusal is the
// invocation's error, by status only, and the body is never logged (logs
// QA: cfn.LambdaWrap printed it whole).
func TestARefusedAnswerDoesNotLogItsBody(t *testing.T) {
	const marker = "AKIA-SECRET-MARKER"
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, "<Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>"+marker+"</AWSAccessKeyId></Error>")
	}))
	defer refusing.Close()
	logged := captureLog(t)
	ev := cfn.Event{RequestType: cfn.RequestDelete, RequestID: "req-1", ResponseURL: refusing.URL,
		LogicalResourceID: "Migrations", StackID: "stack-1", PhysicalResourceID: physicalID}
	err := respond(t.Context(), ev, deploy)
	require.ErrorContains(t, err, "status 403")
	require.NotContains(t, err.Error(), marker)
	require.NotContains(t, logged.String(), marker)
}

// A panic while deploying is answered FAILED (the stack does not wait an
// hour for an answer), keeps the resource's physical id, and its log has
// the stack but not the panic's value, which may quote data.
func TestAPanicIsAnsweredFailedWithoutItsValue(t *testing.T) {
	const marker = "PANIC-VALUE-MARKER"
	cf := newCloudFormation(t)
	logged := captureLog(t)
	ev := cfn.Event{RequestType: cfn.RequestUpdate, RequestID: "req-1", ResponseURL: cf.URL + "/answer",
		LogicalResourceID: "Migrations", StackID: "stack-1", PhysicalResourceID: physicalID}
	err := respond(t.Context(), ev, func(context.Context, cfn.Event) (string, map[string]any, error) {
		panic(marker)
	})
	require.NoError(t, err)
	got := cf.last(t)
	require.Equal(t, "FAILED", got["Status"])
	require.Equal(t, physicalID, got["PhysicalResourceId"])
	require.Equal(t, "req-1", got["RequestId"])
	require.Contains(t, got["Reason"], "panicked")
	require.NotContains(t, logged.String(), marker)
	require.Contains(t, logged.String(), "respond_test.go", "the stack is logged")
	raw, _ := json.Marshal(got)
	require.NotContains(t, string(raw), marker)
}

// A Create that fails before naming its resource answers with the
// request's id, CloudFormation's convention for a resource never made.
func TestAFailedCreateFallsBackToTheRequestID(t *testing.T) {
	cf := newCloudFormation(t)
	ev := cfn.Event{RequestType: cfn.RequestCreate, RequestID: "req-9", ResponseURL: cf.URL + "/answer",
		LogicalResourceID: "Migrations", StackID: "stack-1"}
	err := respond(t.Context(), ev, func(context.Context, cfn.Event) (string, map[string]any, error) {
		return "", map[string]any{"Applied": 1}, io.ErrUnexpectedEOF
	})
	require.NoError(t, err)
	got := cf.last(t)
	require.Equal(t, "FAILED", got["Status"])
	require.Equal(t, "req-9", got["PhysicalResourceId"])
	require.Equal(t, io.ErrUnexpectedEOF.Error(), got["Reason"])
	require.Nil(t, got["Data"], "a failed answer carries no data")
}
