// Command sweeper is the scheduled Lambda (EventBridge) that runs one sweeper
// pass per invocation.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/sweep"
)

func main() {
	a, err := app.Default()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lambda.Start(func(ctx context.Context) (sweep.Result, error) {
		res := a.Sweeper.RunOnce(ctx)
		return res, res.Error()
	})
}
