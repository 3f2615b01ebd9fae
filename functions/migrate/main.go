// Command migrate applies pending migrations to MIGRATION_DATABASE_URL (a
// direct, non-pooled URL) or DATABASE_URL. It runs as a CLI
// (go run ./functions/migrate) or, inside Lambda, as a function to invoke
// once per deploy.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/getratchet/ratchet/lib/db"
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
	return Result{Applied: applied}, err
}

func main() {
	if os.Getenv("AWS_LAMBDA_RUNTIME_API") != "" {
		lambda.Start(migrate)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := migrate(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
	fmt.Printf("migrate: applied %d migration(s) %v\n", len(res.Applied), res.Applied)
}
