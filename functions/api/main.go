// Command api is the whole HTTP API as one AWS Lambda function behind a
// Function URL (buffered mode). Build: scripts/build-lambda.
package main

import (
	"net/http"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/lambdaurl"
)

func main() {
	// Built in the function's init, before the first invocation, as Lambda
	// intends; a build that failed is retried by the requests (serve).
	_, _ = app.Default()
	lambda.Start(lambdaurl.Handler(http.HandlerFunc(serve)))
}

// serve answers a request with the instance's App. A build that failed is
// answered in the API's envelope (httpapi.StartFailed: an exit gave every
// request the Function URL's bare 502) and tried again by a later request
// (app.Default waits a few seconds between tries), as on Vercel: a database
// down at a cold start must not fail the instance for good.
func serve(w http.ResponseWriter, r *http.Request) {
	a, err := app.Default()
	if err != nil {
		httpapi.StartFailed(err).ServeHTTP(w, r)
		return
	}
	a.Server.ServeHTTP(w, r)
}
