// Package migrations embeds the schema as plain, numbered SQL files. A file
// is never edited once it has landed on main: a change is a new file.
package migrations

import "embed"

// FS holds every NNNN_name.sql file in this directory.
//
//go:embed *.sql
var FS embed.FS
