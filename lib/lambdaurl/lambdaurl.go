// Package lambdaurl serves an http.Handler behind an AWS Lambda Function URL
// in buffered mode. aws-lambda-go's own lambdaurl package only supports the
// streaming invoke mode, so this small adapter converts the Function URL
// event into a request and the recorded response back into the event reply.
package lambdaurl

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Handler returns a Lambda handler function serving h.
func Handler(h http.Handler) func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	return func(ctx context.Context, ev events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		if deadline, ok := ctx.Deadline(); ok {
			// The request ends httpapi.AnswerMargin before the invocation
			// does, as every route's Timeout ends that long before the
			// functions' own (httpapi.FunctionTimeout), so that a request
			// out of its time is answered (503 in the envelope) before
			// Lambda stops the function: a route bounded by the
			// invocation's deadline itself (a function given a Timeout
			// under a route's, or a start retried within the invocation)
			// was cut at the moment the function was, and its answer lost
			// to the Function URL's bare 502 and a restarted instance, as
			// the sweeper, migrate and reseal functions each keep a reserve.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline.Add(-httpapi.AnswerMargin))
			defer cancel()
		}
		rec := httptest.NewRecorder()
		if req, err := toRequest(ctx, ev); err != nil {
			// Answered here, without the router: the same envelope and
			// request id as every response, with detail.validation naming
			// what could not be read, as every invalid_request does (API.md
			// §5; QA: it carried an empty detail, and a client reading
			// detail.validation found nothing).
			httpapi.WriteOutsideError(rec, err)
		} else {
			h.ServeHTTP(rec, req)
		}
		res := toResponse(rec)
		if ev.RequestContext.HTTP.Method == http.MethodHead { // as net/http reads it: case and all
			// A server drops a HEAD answer's body, this adapter's own
			// refusal's too (AL review: a HEAD with a bad body kept it);
			// the recorder kept it.
			res.Body, res.IsBase64Encoded = "", false
		}
		return res, nil
	}
}

// toRequest is the request ev carries, or the 400 invalid_request naming
// the part of it that cannot be read (body, path or method).
func toRequest(ctx context.Context, ev events.LambdaFunctionURLRequest) (*http.Request, *apierr.Error) {
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		b, err := base64.StdEncoding.DecodeString(ev.Body)
		if err != nil {
			return nil, apierr.InvalidField("body", "must be base64, as the request event says it is")
		}
		body = b
	}
	target := ev.RawPath
	if target == "" {
		target = "/"
	}
	if ev.RawQueryString != "" {
		target += "?" + ev.RawQueryString
	}
	// Read as a request line's target is (url.ParseRequestURI), as the
	// local server's Go HTTP server reads it: url.Parse, which
	// http.NewRequest uses, takes a path beginning with two slashes for a
	// host and a path (QA: //evil/api/v1/keys was served as /api/v1/keys).
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, apierr.InvalidField("path", "must be percent-encoded (%% and two hex digits)")
	}
	req, err := http.NewRequestWithContext(ctx, ev.RequestContext.HTTP.Method, "/", bytes.NewReader(body))
	if err != nil {
		return nil, apierr.InvalidField("method", "is not an HTTP method")
	}
	req.URL = u
	req.RequestURI = target
	for k, v := range ev.Headers {
		req.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		req.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	req.RemoteAddr = ev.RequestContext.HTTP.SourceIP
	req.Host = ev.RequestContext.DomainName
	req.ContentLength = int64(len(body))
	return req, nil
}

func toResponse(rec *httptest.ResponseRecorder) events.LambdaFunctionURLResponse {
	res := events.LambdaFunctionURLResponse{StatusCode: rec.Code, Headers: map[string]string{}}
	for k, vs := range rec.Header() {
		if strings.EqualFold(k, "Set-Cookie") {
			res.Cookies = append(res.Cookies, vs...)
			continue
		}
		res.Headers[k] = strings.Join(vs, ", ")
	}
	b := rec.Body.Bytes()
	if utf8.Valid(b) {
		res.Body = string(b)
		if escapedLen(res.Body) <= base64.StdEncoding.EncodedLen(len(b))+len(`""`) {
			return res
		}
	}
	res.Body = base64.StdEncoding.EncodeToString(b)
	res.IsBase64Encoded = true
	return res
}

// escapedLen is the length of s in the JSON of the response the runtime
// sends (encoding/json, HTML escaping off): a Function URL answers at most
// 6 MB of it, and an answer (within answer.Budget, 4 MB) whose body is
// mostly quotes and backslashes, each escaped into two bytes, passed that
// as a string where base64, at 4/3 of any body, stays under it. The body is
// sent whichever way is shorter.
func escapedLen(s string) int {
	// jsonx.StringLen counts U+2028 and U+2029 as the three bytes Ratchet's
	// encoder writes them back to; encoding/json writes six.
	return jsonx.StringLen(s) + 3*(strings.Count(s, "\u2028")+strings.Count(s, "\u2029"))
}
