// Command migrate applies pending migrations to DATABASE_URL (or
// MIGRATION_DATABASE_URL, which should be a direct, non-pooled URL).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/migrations"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	url := os.Getenv("MIGRATION_DATABASE_URL")
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	if url == "" {
		fmt.Fprintln(os.Stderr, "migrate: config: DATABASE_URL is required but not set")
		os.Exit(2)
	}
	cfg := &config.Config{DatabaseURL: url}
	applied, err := db.MigrateURL(ctx, cfg.MigrationURL(), migrations.FS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
	fmt.Printf("migrate: applied %d migration(s) %v\n", len(applied), applied)
}
