// Command api is the whole HTTP API as one AWS Lambda function behind a
// Function URL (buffered mode). Build: scripts/build-lambda.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/lambdaurl"
)

func main() {
	a, err := app.Default()
	if err != nil {
		// Answered in the API's envelope, as on Vercel: an exit would
		// give every request the Function URL's bare 502.
		lambda.Start(lambdaurl.Handler(httpapi.StartFailed(err)))
		return
	}
	lambda.Start(lambdaurl.Handler(a.Server))
}
