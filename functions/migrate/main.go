// Command migrate applies pending migrations to MIGRATION_DATABASE_URL (a
// direct, non-pooled URL) or DATABASE_URL. It runs as a CLI
// (go run ./functions/migrate) or inside Lambda, where template.yaml's
// Migrations custom resource invokes it during every deploy whose migrate
// code changed, before the API and the sweeper are updated (deploy), and
// where it may also be invoked by hand.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/migrations"
)

// Result reports what one run applied.
type Result struct {
	Applied []int `json:"applied"`
}

func migrate(ctx context.Context) (Result, error) {
	url := os.Getenv("MIGRATION_DATABASE_URL")
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	if url == "" {
		return Result{}, fmt.Errorf("config: DATABASE_URL is required but not set")
	}
	applied, err := db.MigrateURL(ctx, url, migrations.FS)
	if applied == nil {
		applied = []int{}
	}
	// Its text goes to the function's log, the stack's events and a
	// terminal: a migration that fails over stored data may quote a value.
	return Result{Applied: applied}, redact.Safe(err)
}

// physicalID names the Migrations resource: one per stack, the same on
// every update (a new one would have CloudFormation delete the old).
const physicalID = "ratchet-migrations"

// responseReserve is the part of the invocation's time kept for answering
// CloudFormation: a migration still running when the function is stopped
// would leave the stack waiting an hour for an answer that never comes.
const responseReserve = 15 * time.Second

// deploy is the Migrations custom resource. Create and Update apply the
// pending migrations (a failure fails the deploy before the API changes;
// so does one answered by another version than the deploy's). An update
// that rolls the stack back to an older release (rollback) succeeds
// without touching the database: migrations only go forward, and the older code
// runs on the newer schema (README "Upgrading"); migrating again there
// could only fail the rollback too, as the failure it rolls back from did
// (review: the stack was left UPDATE_ROLLBACK_FAILED). Delete removes
// nothing: the data outlives the stack.
func deploy(ctx context.Context, ev cfn.Event) (string, map[string]any, error) {
	if ev.RequestType == cfn.RequestDelete || rollback(ev) {
		return physicalID, nil, nil
	}
	if version := ev.ResourceProperties["Version"]; !ownVersion(version) {
		// Another release's code would apply its own migrations, not the
		// deploy's, and the new API would go live without its schema
		// (review): fail the deploy instead.
		return physicalID, nil, fmt.Errorf("migrate: the deploy asked for %v, but version %s answered; deploy again",
			version, os.Getenv("AWS_LAMBDA_FUNCTION_VERSION"))
	}
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-responseReserve))
		defer cancel()
	}
	res, err := migrate(ctx)
	if err != nil {
		// The reason shows in the stack's events, and a response must stay
		// under 4 KB: the start of the error, the rest in the log.
		msg := err.Error()
		if len(msg) > maxReason {
			msg = strings.ToValidUTF8(msg[:maxReason], "") + "…"
		}
		log.Printf("migrate: %v", redact.ErrorText(err))
		return physicalID, nil, fmt.Errorf("migrate: %s (the function's log has the rest)", msg)
	}
	return physicalID, map[string]any{"Applied": len(res.Applied)}, nil
}

// maxReason bounds the error text a failed deploy step reports.
const maxReason = 1000

// rollback says whether an update is CloudFormation rolling the stack back:
// it names an older version of the migrate function than the update it
// undoes (versions only grow). By then the alias may point at the older
// version again, so the code answering may be either release's.
func rollback(ev cfn.Event) bool {
	if ev.RequestType != cfn.RequestUpdate {
		return false
	}
	to, ok := versionNumber(ev.ResourceProperties["Version"])
	from, okOld := versionNumber(ev.OldResourceProperties["Version"])
	return ok && okOld && to < from
}

// versionNumber is the N of a published version's ARN (…:function:name:N).
func versionNumber(v any) (int, bool) {
	arn, _ := v.(string)
	n, err := strconv.Atoi(arn[strings.LastIndex(arn, ":")+1:])
	return n, err == nil
}

// ownVersion says whether version (the published version's ARN the
// template passes, ending in :N) is the one running. One the template did
// not give, or a function run unpublished, counts as its own.
func ownVersion(version any) bool {
	arn, _ := version.(string)
	running := os.Getenv("AWS_LAMBDA_FUNCTION_VERSION")
	if arn == "" || running == "" || running == "$LATEST" {
		return true
	}
	return arn[strings.LastIndex(arn, ":")+1:] == running
}

// handle serves both ways the function is invoked: by CloudFormation (an
// event with a RequestType and a ResponseURL), answered through its
// ResponseURL, and by hand (any other event), answered with the result.
func handle(ctx context.Context, raw json.RawMessage) (any, error) {
	var ev cfn.Event
	if json.Unmarshal(raw, &ev) == nil && ev.RequestType != "" && ev.ResponseURL != "" {
		// On a failed send the reason is the error's text, which names the
		// pre-signed ResponseURL, its query a credential for the stack's
		// answer: said once, as redact.Safe has it (the URL without its
		// query), since the Lambda runtime logs the error.
		if err := respond(ctx, ev, deploy); err != nil {
			return nil, fmt.Errorf("answer CloudFormation: %w", redact.Safe(err))
		}
		return map[string]string{"answered": string(ev.RequestType)}, nil
	}
	return migrate(ctx)
}

func main() {
	if os.Getenv("AWS_LAMBDA_RUNTIME_API") != "" {
		lambda.Start(handle)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := migrate(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", redact.ErrorText(err))
		os.Exit(1)
	}
	fmt.Printf("migrate: applied %d migration(s) %v\n", len(res.Applied), res.Applied)
}
