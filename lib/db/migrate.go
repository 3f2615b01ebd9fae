package db

import (
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var migrationName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// LoadMigrations reads NNNN_name.sql files from fsys in version order and
// rejects duplicate versions, which would otherwise apply in a different
// order on different instances.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations: version %04d is used by both %s and %s", out[i].Version, out[i-1].Name, out[i].Name)
		}
	}
	return out, nil
}

// Migrate applies every pending migration in one transaction under a
// transaction-scoped advisory lock, so instances that start together apply
// each file exactly once and a failure leaves nothing half-applied. It works
// through transaction-mode poolers because it holds no session state, but a
// direct URL (MIGRATION_DATABASE_URL) is preferred for long migrations.
func Migrate(ctx context.Context, conn *pgx.Conn, fsys fs.FS) (applied []int, err error) {
	migs, err := LoadMigrations(fsys)
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// 0x72617463 = "ratc": one fixed lock id for schema changes.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1918989411)`); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if err := checkSettings(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlMigrationsTable); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		done := map[int]bool{}
		rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
		if err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		for _, v := range vs {
			done[int(v)] = true
		}
		for _, m := range migs {
			if done[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("apply migration %04d_%s: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// migrateConnectTimeout bounds connecting for migrations, which a start
// waits for: an unreachable database fails the start instead of hanging it.
const migrateConnectTimeout = 10 * time.Second

// MigrateURL connects to url, applies pending migrations and disconnects. It
// sends unnamed statements (exec mode): through a transaction-mode pooler a
// named prepared statement outlives this connection on the server and
// collides with the next migration's. The URL is read as the pool reads
// it: its pool_* settings (pool_max_conns, …) are the pool's, not server
// parameters (serverless QA: sent on, they failed the connection with
// "unrecognized configuration parameter").
func MigrateURL(ctx context.Context, url string, fsys fs.FS) ([]int, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("connect for migrations: %v", redactURLError(err))
	}
	cfg := pc.ConnConfig
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	pinSession(cfg.RuntimeParams)
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > migrateConnectTimeout {
		cfg.ConnectTimeout = migrateConnectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect for migrations: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return Migrate(ctx, conn, fsys)
}

// sqlMigrationsTable records the migrations applied, in the schema the
// search_path creates in.
const sqlMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, ` +
	`name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`

// checkSettings refuses a database whose settings Ratchet cannot work with,
// before anything is created, naming the setting and the fix: a start that
// fails here is better than what each did once running (QA).
//
//   - bytea_output other than hex: pgx reads bytea as hex text only, and
//     every keyed request failed (500) reading its key's hash.
//   - array_nulls off: the NULLs of the arrays a batch report sends were
//     read as the string "NULL", and every job report failed (500).
//   - default_transaction_isolation stricter than read committed: the
//     statements lock rows and re-read their latest versions; with
//     serializable set on the role, six of the gate's concurrency tests
//     failed (begins, reports and settlements under contention).
//   - A search_path that does not find the schema Ratchet was migrated in
//     (it was changed since): migrating would build a second, empty copy
//     in the new schema and serve from it, every workspace gone from view.
//
// The first three cannot be sent at connection start behind PgBouncer (it
// refuses startup parameters it does not track), so they are the
// database's or role's to hold.
func checkSettings(ctx context.Context, tx pgx.Tx) error {
	var byteaOutput, arrayNulls, isolation string
	var visible bool
	var elsewhere *string
	err := tx.QueryRow(ctx, `SELECT current_setting('bytea_output'), current_setting('array_nulls'),
		current_setting('default_transaction_isolation'), to_regclass('schema_migrations') IS NOT NULL,
		(SELECT min(schemaname) FROM pg_tables WHERE tablename = 'schema_migrations')`).
		Scan(&byteaOutput, &arrayNulls, &isolation, &visible, &elsewhere)
	switch {
	case err != nil:
		return fmt.Errorf("read database settings: %w", err)
	case isolation != "read committed":
		return needSetting("default_transaction_isolation", isolation, "'read committed'",
			"its statements lock rows and read their latest versions, which a stricter level answers "+
				"with serialization failures under concurrency")
	case byteaOutput != "hex":
		return needSetting("bytea_output", byteaOutput, "hex", "pgx reads bytea in hex only")
	case arrayNulls != "on":
		return needSetting("array_nulls", arrayNulls, "on", "NULL array elements would read as the text NULL")
	case !visible && elsewhere != nil:
		return fmt.Errorf("this database was migrated in schema %q, which the search_path does not find; "+
			"migrating would build an empty copy beside it: restore the search_path (to install a second "+
			"copy in another schema on purpose, create its schema_migrations first: %s)", *elsewhere, sqlMigrationsTable)
	}
	return nil
}

// needSetting refuses a database setting that is not the default Ratchet
// needs, naming the fix.
func needSetting(name, got, want, why string) error {
	return fmt.Errorf("database setting %s is %q; Ratchet needs %s, the default (%s): "+
		"ALTER DATABASE … SET %s = %s, or on the role", name, got, strings.Trim(want, "'"), why, name, want)
}
