// Command reseal completes a rotation of RESULT_ENCRYPTION_KEY: with the new
// key in RESULT_ENCRYPTION_KEY and the old ones in RESULT_ENCRYPTION_KEYS
// (the settings every instance already runs with), it re-seals everything
// still sealed with an old key under the new one, and says whether the old
// keys can now be removed. -check only counts (and records the key ids it
// found in seal_keys: lib/reseal.Check). It runs as a CLI
// (go run ./functions/reseal [-check]) or, inside Lambda, as a function to
// invoke (event {"check": true} to count); a run cut short by its deadline
// is continued by the next.
//
// Exit status (CLI): 0 when nothing is sealed with a key other than the
// current one, 1 on an error, 2 when something still is.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/reseal"
)

// Event is the Lambda invocation's input.
type Event struct {
	Check bool `json:"check"`
}

func run(ctx context.Context, ev Event) (reseal.Report, error) {
	cfg, err := config.Load()
	if err != nil {
		return reseal.Report{}, err
	}
	sealer, err := cfg.Sealer()
	if err != nil {
		return reseal.Report{}, err
	}
	pool, err := db.Open(ctx, cfg)
	if err != nil {
		return reseal.Unstarted(sealer), err
	}
	defer pool.Close()
	r := reseal.New(pool, sealer)
	if ev.Check {
		return r.Check(ctx)
	}
	return r.Run(ctx)
}

// lambdaReserve is the part of an invocation's time kept for answering: a
// run still going at the function's timeout is stopped there without an
// answer ("Task timed out"), what it did unreported.
const lambdaReserve = 15 * time.Second

// invoke is the Lambda handler: a run that the invocation's time cuts short
// answers what it did so far, complete false (invoke again to continue:
// what is left is found again), rather than the timeout's error.
func invoke(ctx context.Context, ev Event) (reseal.Report, error) {
	cut := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		cut, cancel = context.WithDeadline(ctx, deadline.Add(-lambdaReserve))
		defer cancel()
	}
	rep, err := run(cut, ev)
	err = redact.Safe(err) // the Lambda runtime logs a returned error
	// Only the cut's own error is an answer: another (a malformed
	// DATABASE_URL) met once the time was up was answered as a run to
	// continue, the error lost (ops QA).
	if err != nil && cut.Err() != nil && ctx.Err() == nil && errors.Is(err, cut.Err()) {
		log.Printf("reseal: stopped to answer in time (%v); invoke again to continue", redact.ErrorText(err))
		rep.Complete = false
		return rep, nil
	}
	return rep, err
}

func main() {
	if os.Getenv("AWS_LAMBDA_RUNTIME_API") != "" {
		lambda.Start(invoke)
		return
	}
	check := flag.Bool("check", false, "count ciphertexts by key, change none")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, Event{Check: *check})
	os.Exit(answer(os.Stdout, os.Stderr, rep, err, *check, *asJSON))
}

// answer prints a run's report and returns the exit status: 0 when nothing
// is sealed with a key other than the current one, 1 on an error (an
// interrupted run's partial report is printed first), 2 when something
// still is.
func answer(stdout, stderr io.Writer, rep reseal.Report, err error, check, asJSON bool) int {
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "reseal:", redact.ErrorText(err))
		return 1
	}
	if err != nil {
		// Interrupted: whatever it counted is not a verdict. A count
		// stopped between its columns printed "not sealed with the current
		// key" of columns it never read, and one stopped while recording
		// the key ids (after a complete count, seal_keys not brought up to
		// it) printed "older keys can be removed", complete true in JSON.
		rep.Complete, rep.Counted = false, false
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printReport(stdout, rep, check)
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "reseal: interrupted; run it again to continue")
		return 1
	case !rep.Complete:
		return 2
	}
	return 0
}

func printReport(w io.Writer, rep reseal.Report, check bool) {
	fmt.Fprintf(w, "current key id %s\n", rep.CurrentKeyID)
	var corrupt int64
	for _, c := range rep.Columns {
		corrupt += c.Corrupt
		if check {
			fmt.Fprintf(w, "%-28s current %d, older %d, unknown key %d\n", c.Column, c.Current, c.Older, c.Unknown)
			continue
		}
		if !rep.Counted {
			// Stopped before the closing count: its zeros say nothing.
			fmt.Fprintf(w, "%-28s resealed %d, skipped (busy, changed or deleted) %d, corrupt %d; stopped before counting\n",
				c.Column, c.Resealed, c.Skipped, c.Corrupt)
			continue
		}
		// The closing count counts the corrupt ones by their header.
		fmt.Fprintf(w, "%-28s resealed %d, skipped (busy, changed or deleted) %d; "+
			"now current %d, older key %d, unknown key %d, of which corrupt %d\n",
			c.Column, c.Resealed, c.Skipped, c.Current, c.Older, c.Unknown, c.Corrupt)
	}
	if corrupt > 0 {
		fmt.Fprintf(w, "%d value(s) fail to open under the key they name (damaged, or copied from another row): "+
			"no key mends them, and they keep the older keys in use until each is nulled or its row deleted "+
			"(README, Rotating RESULT_ENCRYPTION_KEY); the first %d:\n", corrupt, len(rep.Damaged))
		for _, d := range rep.Damaged {
			fmt.Fprintf(w, "  %s\n", d)
		}
	}
	switch {
	case rep.Complete:
		fmt.Fprintln(w, "every ciphertext is sealed with the current key: older keys can be removed")
	case !rep.Counted:
		fmt.Fprintln(w, "stopped before it was done: keep the older keys and run it again")
	case check:
		fmt.Fprintln(w, "some ciphertexts are not sealed with the current key: run reseal before removing older keys")
	default:
		fmt.Fprintln(w, "some ciphertexts are still not sealed with the current key: keep the older keys "+
			"(rows busy or changed during the run are resealed by running it again; unknown-key and "+
			"corrupt ones cannot be opened with the configured keys, and the corrupt ones with none)")
	}
}
