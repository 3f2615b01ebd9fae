// Command sweeper is the scheduled Lambda (EventBridge) that runs one sweeper
// pass per invocation.
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/sweep"
)

func main() { lambda.Start(handler(app.Default)) }

// answerReserve is the part of an invocation's time a pass leaves for
// answering, as the cron route's pass leaves its function's (httpapi's
// CronTimeout, 27 s of 30): the invocation's own deadline is when Lambda
// stops the function ("Task timed out"), and a pass given all of it let its
// last task run to that instant, a task stuck on a lock included, and a
// delivery round's record (which runs past the pass's deadline by the time
// its claim took) be cut off there, its sent deliveries sent again a
// minute later (deploy QA).
const answerReserve = 3 * time.Second

// handler runs one pass of the instance's app per invocation, leaving
// answerReserve of its time to answer. The app is built at the first
// invocation and kept (app.Default); a start that failed is that
// invocation's error and is tried again by a later one, as the API
// function's is, rather than ending the process at init.
func handler(instance func() (*app.App, error)) func(context.Context) (sweep.Result, error) {
	return func(ctx context.Context) (sweep.Result, error) {
		a, err := instance()
		if err != nil {
			// The Lambda runtime logs a returned error.
			return sweep.Result{}, fmt.Errorf("sweeper: start: %w", redact.Safe(err))
		}
		if deadline, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline.Add(-answerReserve))
			defer cancel()
		}
		res := a.Sweeper.RunOnce(ctx)
		return res, res.Error()
	}
}
