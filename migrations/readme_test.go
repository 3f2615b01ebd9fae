package migrations

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// README's upgrade notes tell an operator to build a migration's indexes
// first, concurrently, on large tables. One a later migration drops is built
// for nothing by an upgrade past that one (a long build on exactly the
// tables these notes are about), so each such statement says which
// migration drops it (as 0017's events_created_idx says of 0063): 0087
// dropped job_runs_finished_idx and events_dispatched_idx, and the notes of
// 0017 and 0063 still said to build them (review).
func TestReadmeSaysWhichMigrationDropsAnIndexItSaysToBuildFirst(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	dropped := map[string]string{} // index name -> the migration that drops it
	drop := regexp.MustCompile(`(?i)DROP INDEX (?:CONCURRENTLY )?(?:IF EXISTS )?([a-z_0-9]+)`)
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	for _, name := range names {
		sql, err := fs.ReadFile(FS, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range drop.FindAllStringSubmatch(string(sql), -1) {
			dropped[strings.ToLower(m[1])] = name[:4]
		}
	}
	create := regexp.MustCompile(`CREATE INDEX CONCURRENTLY IF NOT EXISTS ([a-z_0-9]+)`)
	checked := 0
	for _, loc := range create.FindAllStringSubmatchIndex(readme, -1) {
		index := readme[loc[2]:loc[3]]
		by, ok := dropped[index]
		if !ok {
			continue
		}
		checked++
		// The statement, to its end (";" or the closing "`"), and the rest
		// of that line.
		rest := readme[loc[1]:]
		end := strings.IndexAny(rest, ";`")
		if end < 0 {
			end = len(rest)
		}
		if nl := strings.IndexByte(rest[end:], '\n'); nl >= 0 {
			end += nl
		} else {
			end = len(rest)
		}
		if want := fmt.Sprintf("%s drops it", by); !strings.Contains(rest[:end], want) {
			t.Errorf("README says to build %s first, which migration %s drops, without saying %q after it", index, by, want)
		}
	}
	if checked == 0 {
		t.Fatal("no index README says to build first is dropped by a migration: the check reads nothing")
	}
}
