// Package console is the operator console: one page, its script, its
// stylesheet and its icon (static/), a client of the same origin's /api/v1
// for the tasks an operator does by hand: approvals, unknown outcomes,
// circuits and the emergency stop, policies, runs and replays, queue health
// and endpoints, effect groups, keys and webhooks.
//
// The files are embedded, so every binary serves the same console: the
// local server and Lambda from the router (lib/httpapi), Vercel from the
// copies genvercel writes under public/, with the same headers (vercel.json).
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"net/http"
	"path"
	"sort"
	"time"
)

//go:embed static/index.html static/console.js static/console.css static/favicon.svg
var static embed.FS

// Page is the console's address.
const Page = "/console"

// Headers go with every console file. The script builds every element from
// text and keeps the key in this origin's sessionStorage, so the policy can
// forbid inline script and style, every other origin, framing (a console
// that can be framed can be clicked through) and form posts; no-referrer
// keeps console URLs (which name effects and runs) out of other sites' logs.
var Headers = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
		"img-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	// No window it opens, or that opens it, shares its browsing context.
	"Cross-Origin-Opener-Policy": "same-origin",
	"X-Frame-Options":            "DENY",
	"Referrer-Policy":            "no-referrer",
	// Revalidated on every load (the ETag makes that a 304), so a new
	// release's script is never run against a cached page, or the reverse.
	"Cache-Control": "no-cache",
}

// File is one console file and the paths it is served at.
type File struct {
	Name        string   // under static/ and under public/console/
	Paths       []string // ServeMux patterns
	ContentType string
	Body        []byte
	ETag        string
}

var files = load()

func load() []File {
	specs := []struct {
		name, contentType string
		paths             []string
	}{
		// The page answers at /console and /console/ too; it names its
		// script and stylesheet by absolute path, so either works.
		{"index.html", "text/html; charset=utf-8", []string{Page, Page + "/{$}", Page + "/index.html"}},
		{"console.js", "text/javascript; charset=utf-8", []string{Page + "/console.js"}},
		{"console.css", "text/css; charset=utf-8", []string{Page + "/console.css"}},
		// Named by the page, so a browser does not ask for /favicon.ico,
		// which no route serves.
		{"favicon.svg", "image/svg+xml", []string{Page + "/favicon.svg"}},
	}
	out := make([]File, 0, len(specs))
	for _, s := range specs {
		b, err := static.ReadFile(path.Join("static", s.name))
		if err != nil {
			panic("console: " + s.name + " is not embedded: " + err.Error())
		}
		sum := sha256.Sum256(b)
		out = append(out, File{Name: s.name, Paths: s.paths, ContentType: s.contentType, Body: b,
			ETag: `"` + hex.EncodeToString(sum[:12]) + `"`})
	}
	return out
}

// Files are the console's files.
func Files() []File { return files }

// Handler serves f: GET and HEAD, If-None-Match answered 304.
func Handler(f File) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		keys := make([]string, 0, len(Headers))
		for k := range Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			h.Set(k, Headers[k])
		}
		h.Set("Content-Type", f.ContentType)
		h.Set("ETag", f.ETag)
		http.ServeContent(w, r, f.Name, time.Time{}, bytes.NewReader(f.Body))
	})
}
