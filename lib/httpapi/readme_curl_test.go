package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// README's curl commands are run, not only read (docs QA: a newcomer follows
// "Try it" and "The effect gate" literally). TestReadmeCurlSequence replays
// every curl command of README.md's ```sh blocks, in order, against the real
// service, and holds each answer to the "# →" line written under it: every
// field shown there must be in the answer, with the value shown, a "ws_…"
// standing for a string that starts with ws_ and a bare … for anything. A
// placeholder in a command (`eff_…` in a path, a "…" field of a body, an
// `export NAME=rk_…`) is filled from the answers before it, as the reader
// fills it by copying. Every command must succeed (2xx): the blocks show the
// way through, not its refusals. Only the ```sh blocks count, so prose edits
// never break it; a command that no longer works as shown, or an answer that
// lost a documented field, does.
func TestReadmeCurlSequence(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	curls := replayShellBlocks(t, env, filepath.Join("..", "..", "README.md"), nil)
	// The workspace, the key and the gate's begin and report at least.
	require.GreaterOrEqual(t, curls, 4, "README's sh blocks lost their curl commands")
}

// The guides' sh blocks are replayed the same way, each guide in a workspace
// of its own in which an endpoint was created: their `export OPERATOR=rk_…`
// and `export ENDPOINT=end_…` stand for the reader's operator key and an
// endpoint of theirs (the guides say where each comes from).
func TestGuidesCurlSequences(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	guides, err := filepath.Glob(filepath.Join("..", "..", "docs", "guides", "*.md"))
	require.NoError(t, err)
	curls := 0
	for _, guide := range guides {
		ws := env.Signup()
		signup := map[string]any{"secret": ws.Key} // the operator key, as signup answered it
		endpoint := readmeDecode(t, env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key,
			map[string]any{"name": "Email service"}).Body)
		curls += replayShellBlocks(t, env, guide, []any{signup, endpoint})
	}
	// Backoff, circuit breaker and worker deployment at least.
	require.GreaterOrEqual(t, curls, 3, "the guides' sh blocks lost their curl commands")
}

// A guide whose sh blocks set up the reader's shell (mint a key, name the
// origin) exports there every variable its code then reads: the worker
// guide minted a WORKER key and left the reader to guess that its Go code
// reads the secret from RATCHET_WORKER_KEY. Guides without sh blocks name
// their variables in the code's comments.
func TestGuidesExportWhatTheirCodeReads(t *testing.T) {
	t.Parallel()
	guides, err := filepath.Glob(filepath.Join("..", "..", "docs", "guides", "*.md"))
	require.NoError(t, err)
	reads := regexp.MustCompile(`os\.Getenv\("([A-Z0-9_]+)"\)|process\.env\.([A-Z0-9_]+)`)
	checked := 0
	for _, guide := range guides {
		raw, err := os.ReadFile(guide)
		require.NoError(t, err)
		exported := map[string]bool{}
		for _, s := range readmeShellSteps(t, string(raw)) {
			if s.kind == stepExport {
				name, _, _ := strings.Cut(strings.Fields(strings.TrimPrefix(s.text, "export "))[0], "=")
				exported[name] = true
			}
		}
		if len(exported) == 0 {
			continue
		}
		for _, m := range reads.FindAllStringSubmatch(string(raw), -1) {
			name := m[1] + m[2]
			checked++
			require.True(t, exported[name], "docs/guides/%s: its code reads %s, which its sh blocks never export",
				filepath.Base(guide), name)
		}
	}
	require.Positive(t, checked, "no guide's code reads a variable its sh blocks export any more")
}

// replayShellBlocks replays the sh blocks of one document, after the given
// answers, and answers how many curl commands it ran.
func replayShellBlocks(t *testing.T, env *apitest.Env, file string, answers []any) int {
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	name := filepath.Base(file)
	if filepath.Base(filepath.Dir(file)) == "guides" {
		name = "docs/guides/" + name
	}
	vars := map[string]string{}
	curls := 0
	run := func(where, command string) any {
		curls++
		method, path, header, body := readmeCurl(t, where, command, vars, answers)
		res := env.DoWith(method, path, "", header, body)
		require.Less(t, res.Status, 300, "%s\nanswered %d: %s", where, res.Status, res.Body)
		answer := readmeDecode(t, res.Body)
		answers = append(answers, answer)
		return answer
	}
	for _, s := range readmeShellSteps(t, string(raw)) {
		where := fmt.Sprintf("%s line %d: %s", name, s.line, s.text)
		switch s.kind {
		case stepExport:
			variable, value, ok := strings.Cut(strings.Fields(strings.TrimPrefix(s.text, "export "))[0], "=")
			require.True(t, ok, where)
			if prefix, elided := strings.CutSuffix(value, "…"); elided {
				found, ok := readmeFindString(answers, prefix)
				require.True(t, ok, "%s: no answer before it holds a %q… value", where, prefix)
				value = found
			}
			vars[variable] = value
		case stepCapture: // NAME=$(curl … | jq [-r] .field.path)
			m := readmeCapture.FindStringSubmatch(s.text)
			answer := run(where, m[2])
			for _, field := range strings.Split(strings.TrimPrefix(m[4], "."), ".") {
				obj, ok := answer.(map[string]any)
				require.True(t, ok, "%s: no %s in the answer", where, m[4])
				answer, ok = obj[field]
				require.True(t, ok, "%s: no %s in the answer", where, m[4])
			}
			if text, isString := answer.(string); isString && m[3] != "" {
				vars[m[1]] = text
			} else {
				out, err := json.Marshal(answer)
				require.NoError(t, err)
				vars[m[1]] = string(out)
			}
		case stepCurl:
			run(where, s.text)
		case stepExpect:
			require.NotEmpty(t, answers, "%s: a documented answer before any curl", where)
			doc := readmeDocumentedJSON(t, where, s.text)
			readmeCompare(t, where, "", doc, answers[len(answers)-1])
		}
	}
	return curls
}

func readmeDecode(t *testing.T, body []byte) any {
	var answer any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&answer), "the answer is not JSON: %s", body)
	return answer
}

// readmeCapture reads `NAME=$(curl … | jq .field)`, as the guides read a
// policy's version.
var readmeCapture = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=\$\((curl .*) \| jq( -r)? (\.[A-Za-z0-9_.]+)\)$`)

type readmeStepKind int

const (
	stepCurl readmeStepKind = iota
	stepExport
	stepCapture
	stepExpect
)

type readmeStep struct {
	kind readmeStepKind
	line int
	text string
}

// readmeShellSteps reads the commands of README's ```sh blocks: curl
// commands (with their continuation lines joined), exports, and the
// "# →" lines that document the answer of the curl before them. Other
// lines (scripts/dev, comments, the health wait) are the reader's.
func readmeShellSteps(t *testing.T, readme string) []readmeStep {
	var steps []readmeStep
	lines := strings.Split(readme, "\n")
	in := false
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if !in {
			in = line == "```sh"
			continue
		}
		if strings.HasPrefix(line, "```") {
			in = false
			continue
		}
		start := i + 1
		for i+1 < len(lines) {
			if strings.HasSuffix(line, `\`) {
				i++
				line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
			} else if readmeOpenQuote(line) { // a quoted body spanning lines
				i++
				line += "\n" + lines[i]
			} else {
				break
			}
		}
		switch {
		case strings.HasPrefix(line, "# →"):
			steps = append(steps, readmeStep{stepExpect, start, strings.TrimSpace(strings.TrimPrefix(line, "# →"))})
		case strings.HasPrefix(line, "curl "):
			steps = append(steps, readmeStep{stepCurl, start, line})
		case strings.HasPrefix(line, "export "):
			steps = append(steps, readmeStep{stepExport, start, line})
		case readmeCapture.MatchString(line):
			steps = append(steps, readmeStep{stepCapture, start, line})
		}
	}
	require.False(t, in, "README.md has an unclosed ```sh block")
	return steps
}

// readmeOpenQuote says whether a line leaves a quote open, as the shell
// reads quotes.
func readmeOpenQuote(line string) bool {
	var open byte
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case open == 0 && c == '#' && (i == 0 || line[i-1] == ' '):
			return false
		case open == 0 && (c == '\'' || c == '"'):
			open = c
		case open == '"' && c == '\\':
			i++
		case c == open:
			open = 0
		}
	}
	return open != 0
}

// readmeCurl turns a curl command into a request to the test server.
func readmeCurl(t *testing.T, where, command string, vars map[string]string, answers []any) (
	method, path string, header http.Header, body any) {
	words := readmeShellWords(t, where, command, vars)
	header = http.Header{}
	var url string
	var data *string
	for i := 1; i < len(words); i++ {
		w := words[i]
		takes := w == "-X" || w == "-H" || w == "-d" || w == "--data" || w == "-o"
		if takes {
			require.Less(t, i+1, len(words), "%s: %s takes an argument", where, w)
			i++
		}
		switch {
		case w == "-X":
			method = words[i]
		case w == "-H":
			name, value, ok := strings.Cut(words[i], ":")
			require.True(t, ok, "%s: header %q", where, words[i])
			header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		case w == "-d" || w == "--data":
			d := words[i]
			data = &d
		case takes, strings.HasPrefix(w, "-"):
		default:
			require.Empty(t, url, "%s: two URLs", where)
			url = w
		}
	}
	url = strings.TrimPrefix(url, "http://")
	rest, ok := strings.CutPrefix(url, "localhost:8787")
	require.True(t, ok, "%s: the URL is not the local server's (localhost:8787)", where)
	segments := strings.Split(rest, "/")
	for i, seg := range segments {
		if prefix, elided := strings.CutSuffix(seg, "…"); elided {
			found, ok := readmeFindString(answers, prefix)
			require.True(t, ok, "%s: no answer before it holds a %q… value", where, prefix)
			segments[i] = found
		}
	}
	path = strings.Join(segments, "/")
	if method == "" {
		method = "GET"
		if data != nil {
			method = "POST" // as curl does with -d
		}
	}
	if data == nil {
		return method, path, header, nil
	}
	if !strings.Contains(*data, "…") {
		return method, path, header, *data
	}
	var doc any
	require.NoError(t, json.Unmarshal([]byte(*data), &doc), "%s: the body is not JSON", where)
	filled, err := json.Marshal(readmeFill(t, where, doc, answers))
	require.NoError(t, err)
	return method, path, header, filled
}

// readmeFill replaces each "…" string of a body with the value of the same
// field in the answers before it, and each "eff_…" with a string so prefixed.
func readmeFill(t *testing.T, where string, v any, answers []any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			s, isString := x.(string)
			prefix, elided := strings.CutSuffix(s, "…")
			switch {
			case isString && elided && prefix == "":
				found, ok := readmeFindField(answers, k)
				require.True(t, ok, "%s: no answer before it has a %q field", where, k)
				v[k] = found
			case isString && elided:
				found, ok := readmeFindString(answers, prefix)
				require.True(t, ok, "%s: no answer before it holds a %q… value", where, prefix)
				v[k] = found
			default:
				v[k] = readmeFill(t, where, x, answers)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = readmeFill(t, where, x, answers)
		}
	}
	return v
}

// readmeFindString finds, newest answer first, a string value that starts
// with prefix and is longer than it.
func readmeFindString(answers []any, prefix string) (string, bool) {
	for i := len(answers) - 1; i >= 0; i-- {
		var found string
		readmeWalk(answers[i], func(_ string, v any) bool {
			if s, ok := v.(string); ok && len(s) > len(prefix) && strings.HasPrefix(s, prefix) {
				found = s
				return true
			}
			return false
		})
		if found != "" {
			return found, true
		}
	}
	return "", false
}

// readmeFindField finds, newest answer first, the value of a field so named.
func readmeFindField(answers []any, name string) (any, bool) {
	for i := len(answers) - 1; i >= 0; i-- {
		var found any
		ok := readmeWalk(answers[i], func(k string, v any) bool {
			if k == name {
				found = v
				return true
			}
			return false
		})
		if ok {
			return found, true
		}
	}
	return nil, false
}

// readmeWalk visits every value depth first, object keys in order, until
// visit says it found what it looked for.
func readmeWalk(v any, visit func(key string, v any) bool) bool {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if visit(k, v[k]) || readmeWalk(v[k], visit) {
				return true
			}
		}
	case []any:
		for _, x := range v {
			if visit("", x) || readmeWalk(x, visit) {
				return true
			}
		}
	}
	return false
}

// readmeShellWords splits a command as the shell does, for what README's
// commands use: single quotes, double quotes and $NAME.
func readmeShellWords(t *testing.T, where, s string, vars map[string]string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	expand := func(i int) int { // s[i] == '$'; returns the index after the name
		j := i + 1
		for j < len(s) && (s[j] == '_' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z' ||
			j > i+1 && s[j] >= '0' && s[j] <= '9') {
			j++
		}
		name := s[i+1 : j]
		value, ok := vars[name]
		require.True(t, ok, "%s: $%s is used before an export sets it", where, name)
		cur.WriteString(value)
		return j
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			i++
		case c == '#' && !inWord: // a comment to the end of the line
			i = len(s)
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			require.GreaterOrEqual(t, end, 0, "%s: unclosed single quote", where)
			cur.WriteString(s[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case c == '"':
			inWord = true
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s):
					i++
					cur.WriteByte(s[i])
				case s[i] == '$':
					i = expand(i) - 1
				default:
					cur.WriteByte(s[i])
				}
			}
			require.Less(t, i, len(s), "%s: unclosed double quote", where)
			i++
		case c == '$':
			inWord = true
			i = expand(i)
		default:
			inWord = true
			cur.WriteByte(c)
			i++
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// readmeDocumentedJSON reads the object a "# →" line shows, its elisions
// (a bare …, as in [ … ] or a trailing ,…) dropped.
func readmeDocumentedJSON(t *testing.T, where, line string) any {
	start := strings.IndexByte(line, '{')
	require.GreaterOrEqual(t, start, 0, "%s: no object shown", where)
	// The object, to its closing brace, without the bare ellipses.
	var obj strings.Builder
	depth, inString, escaped := 0, false, false
	for _, r := range line[start:] {
		if inString {
			obj.WriteRune(r)
			switch {
			case escaped:
				escaped = false
			case r == '\\':
				escaped = true
			case r == '"':
				inString = false
			}
			continue
		}
		switch r {
		case '"':
			inString = true
		case '…':
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		obj.WriteRune(r)
		if depth == 0 {
			break
		}
	}
	// Commas left around what was elided: ",," "{," ",}" ",]".
	src := obj.String()
	var out strings.Builder
	inString = false
	for i := 0; i < len(src); i++ {
		c := src[i]
		if inString {
			out.WriteByte(c)
			if c == '\\' && i+1 < len(src) {
				i++
				out.WriteByte(src[i])
			} else if c == '"' {
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
		}
		if c == ',' {
			prev := strings.TrimRight(out.String(), " ")
			next := strings.TrimLeft(src[i+1:], " ")
			if strings.HasSuffix(prev, "{") || strings.HasSuffix(prev, "[") || strings.HasSuffix(prev, ",") ||
				strings.HasPrefix(next, "}") || strings.HasPrefix(next, "]") || strings.HasPrefix(next, ",") {
				continue
			}
		}
		out.WriteByte(c)
	}
	var doc any
	dec := json.NewDecoder(strings.NewReader(out.String()))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&doc), "%s: the documented answer does not read as JSON once its … are dropped: %s",
		where, out.String())
	return doc
}

// readmeCompare holds an answer to what README shows of it.
func readmeCompare(t *testing.T, where, path string, doc, got any) {
	switch d := doc.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		require.True(t, ok, "%s: %s is documented as an object, answered %v", where, readmePath(path), got)
		for k, dv := range d {
			gv, ok := g[k]
			require.True(t, ok, "%s: the answer has no %s", where, readmePath(path+"."+k))
			readmeCompare(t, where, path+"."+k, dv, gv)
		}
	case []any:
		g, ok := got.([]any)
		require.True(t, ok, "%s: %s is documented as a list, answered %v", where, readmePath(path), got)
		require.GreaterOrEqual(t, len(g), len(d), "%s: %s", where, readmePath(path))
		for i, dv := range d {
			readmeCompare(t, where, fmt.Sprintf("%s.%d", path, i), dv, g[i])
		}
	case string:
		g, ok := got.(string)
		require.True(t, ok, "%s: %s is documented as a string, answered %v", where, readmePath(path), got)
		if prefix, elided := strings.CutSuffix(d, "…"); elided {
			require.True(t, strings.HasPrefix(g, prefix), "%s: %s is documented as %q, answered %q",
				where, readmePath(path), d, g)
		} else {
			require.Equal(t, d, g, "%s: %s", where, readmePath(path))
		}
	default: // json.Number, bool, nil
		require.Equal(t, doc, got, "%s: %s", where, readmePath(path))
	}
}

func readmePath(p string) string {
	if p == "" {
		return "the answer"
	}
	return strings.TrimPrefix(p, ".")
}
