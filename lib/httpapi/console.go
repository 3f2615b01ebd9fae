package httpapi

import (
	"github.com/getratchet/ratchet/lib/console"
)

// consoleRoutes serve the operator console's files (lib/console) through
// the router, so the local server and Lambda answer them with the request
// id and the log line every response gets, and any other path or method
// under /console as an unknown route. They are pages, not API: Routes() —
// and so the OpenAPI document, the manifest, llms.txt and the Vercel
// functions — leaves them out; on Vercel the files are public/'s
// (VercelStaticFiles) with the same headers (VercelJSON).
func consoleRoutes() []Route {
	var out []Route
	for _, f := range console.Files() {
		for _, p := range f.Paths {
			out = append(out, Route{Method: "GET", Pattern: p, Name: "console", Tag: "console", Auth: AuthNone,
				Status: 200, Raw: console.Handler(f)})
		}
	}
	return out
}
