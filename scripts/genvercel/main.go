// Command genvercel writes api/**.go, vercel.json and public/ from the route table.
// Run it after adding a route: go run ./scripts/genvercel
package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/getratchet/ratchet/lib/httpapi"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "genvercel:", err)
		os.Exit(1)
	}
}

func run() error {
	want := map[string]bool{}
	for _, f := range httpapi.VercelFunctions() {
		want[f.File] = true
		if err := os.MkdirAll(filepath.Dir(f.File), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.File, []byte(httpapi.VercelFileSource(f)), 0o644); err != nil {
			return err
		}
	}
	// Remove generated files whose route is gone.
	err := filepath.WalkDir("api", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || want[filepath.ToSlash(p)] {
			return err
		}
		return os.Remove(p)
	})
	if err != nil {
		return err
	}
	removeEmptyDirs("api")
	for name, body := range httpapi.VercelStaticFiles() {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(name, body, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile("vercel.json", httpapi.VercelJSON(), 0o644)
}

func removeEmptyDirs(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i]) // fails harmlessly when not empty
	}
}
