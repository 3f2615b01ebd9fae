// Command api is the whole HTTP API as one AWS Lambda function behind a
// Function URL (buffered mode). Build: scripts/build-lambda.
package main

import (
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/lambdaurl"
)

func main() {
	a, err := app.Default()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lambda.Start(lambdaurl.Handler(a.Server))
}
