// Command sweeper is the scheduled Lambda (EventBridge) that runs one sweeper
// pass per invocation.
package main

import (
	"context"
	"fmt"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/sweep"
)

func main() { lambda.Start(handler(app.Default)) }

// handler runs one pass of the instance's app per invocation. The app is
// built at the first invocation and kept (app.Default); a start that failed
// is that invocation's error and is tried again by a later one, as the API
// function's is, rather than ending the process at init.
func handler(instance func() (*app.App, error)) func(context.Context) (sweep.Result, error) {
	return func(ctx context.Context) (sweep.Result, error) {
		a, err := instance()
		if err != nil {
			// The Lambda runtime logs a returned error.
			return sweep.Result{}, fmt.Errorf("sweeper: start: %w", redact.Safe(err))
		}
		res := a.Sweeper.RunOnce(ctx)
		return res, res.Error()
	}
}
