package redact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

const marker = "SECRET-MARKER-123"

// A data exception's message quotes the value Postgres refused; logged as
// it was (QA: a begin whose key a cast refused logged `invalid input syntax
// for type integer: "<the idempotency key>"`), it is now withheld, the
// SQLSTATE, the routine and what wraps it kept.
func TestErrorTextWithholdsADataExceptionsMessage(t *testing.T) {
	t.Parallel()
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Routine: "pg_strtoint32_safe",
		Message: `invalid input syntax for type integer: "` + marker + `"`}
	got := ErrorText(fmt.Errorf("begin: %w", pe))
	require.NotContains(t, got, marker)
	require.Equal(t, "begin: ERROR: data exception, its message withheld from logs (SQLSTATE 22P02, routine pg_strtoint32_safe)", got)

	// Twice in a tree, and inside errors.Join.
	got = ErrorText(errors.Join(fmt.Errorf("a: %w", pe), errors.New("b")))
	require.NotContains(t, got, marker)
	require.Contains(t, got, "b")
}

// A PL/pgSQL RAISE's message is what its function formatted, with what it
// was given (jobs_enqueue's names a tool): withheld whatever its SQLSTATE
// (logleak QA: a trigger raising on an idempotency key logged the key).
func TestErrorTextWithholdsARaisedExceptionsMessage(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"P0001", "RTB01", "23514"} {
		pe := &pgconn.PgError{Severity: "ERROR", Code: code, Routine: "exec_stmt_raise",
			Message: "jobs_enqueue: contract 3 of " + marker + " not found"}
		got := ErrorText(fmt.Errorf("enqueue: %w", pe))
		require.Equal(t, "enqueue: ERROR: raised exception, its message withheld from logs (SQLSTATE "+code+
			", routine exec_stmt_raise)", got)
	}
}

// A constraint violation keeps its message: it names the constraint, and
// the key or row its Detail quotes is not in Error().
func TestErrorTextKeepsAConstraintViolation(t *testing.T) {
	t.Parallel()
	pe := &pgconn.PgError{Severity: "ERROR", Code: "23505", ConstraintName: "effects_ws_key",
		Message: `duplicate key value violates unique constraint "effects_ws_key"`,
		Detail:  "Key (workspace_id, idempotency_key)=(ws_1, " + marker + ") already exists."}
	err := fmt.Errorf("begin: %w", pe)
	require.Equal(t, err.Error(), ErrorText(err))
	require.NotContains(t, ErrorText(err), marker)
}

// pgx quotes the Go value of an argument it cannot encode (%#v).
func TestErrorTextWithholdsAnArgumentPgxCannotEncode(t *testing.T) {
	t.Parallel()
	_, encErr := pgtype.NewMap().Encode(pgtype.Int4OID, pgtype.BinaryFormatCode, struct{ Key string }{marker}, nil)
	require.ErrorContains(t, encErr, marker)
	err := fmt.Errorf("begin: %w", fmt.Errorf("failed to encode args[2]: %w", encErr))
	got := ErrorText(err)
	require.NotContains(t, got, marker)
	require.Equal(t, "begin: failed to encode args[2]: unable to encode an argument (value withheld from logs)", got)
}

func TestErrorTextWithholdsParsedInputAndURLs(t *testing.T) {
	t.Parallel()
	_, numErr := strconv.Atoi(marker)
	got := ErrorText(fmt.Errorf("cursor: %w", numErr))
	require.NotContains(t, got, marker)
	require.Equal(t, "cursor: strconv.Atoi: parsing a value withheld from logs: invalid syntax", got)

	// A receiver's credentials and a pre-signed URL's signature.
	uerr := &url.Error{Op: "Put", URL: "https://user:" + marker + "@bucket.example/o?X-Amz-Signature=" + marker,
		Err: errors.New("dial tcp: connection refused")}
	got = ErrorText(fmt.Errorf("answer: %w", uerr))
	require.NotContains(t, got, marker)
	require.Equal(t, `answer: Put "https://…@bucket.example/o?…": dial tcp: connection refused`, got)
	require.NotContains(t, ErrorText(&url.Error{Op: "Get", URL: "%zz" + marker, Err: errors.New("x")}), marker)
}

// An error that renders what it wraps otherwise than as its text (quoted
// here) cannot be cut around it: only the withheld parts are said.
func TestErrorTextOfAWrapperThatRewordsWithholdsAll(t *testing.T) {
	t.Parallel()
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22003", Message: `value "` + marker + `" is out of range for type integer`}
	got := ErrorText(quoting{pe})
	require.NotContains(t, got, marker)
	require.Contains(t, got, "SQLSTATE 22003")
	require.Empty(t, ErrorText(nil))
	require.Equal(t, "plain", ErrorText(errors.New("plain")))
}

type quoting struct{ err error }

func (q quoting) Error() string { return fmt.Sprintf("wrapped %q", q.err.Error()) }
func (q quoting) Unwrap() error { return q.err }

// Safe keeps the chain for errors.Is and As, its text ErrorText's; an
// error that wraps it is cut around it, not withheld whole.
func TestSafeKeepsTheChain(t *testing.T) {
	t.Parallel()
	require.NoError(t, Safe(nil))
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: marker}
	err := Safe(fmt.Errorf("migrate: %w", pe))
	require.NotContains(t, err.Error(), marker)
	var got *pgconn.PgError
	require.ErrorAs(t, err, &got)
	require.Same(t, pe, got)
	require.Equal(t, "start: "+err.Error(), ErrorText(fmt.Errorf("start: %w", err)))
	require.Equal(t, err, Safe(err))
}

// A logger from Logger writes every error an attribute holds as ErrorText,
// at the top level, in a group and in attributes bound beforehand.
func TestLoggerWritesErrorsAsErrorText(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := Logger(slog.New(slog.NewJSONHandler(&buf, nil)))
	require.Same(t, l, Logger(l), "not wrapped twice")
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: marker}
	l.With("bound", fmt.Errorf("x: %w", pe)).WithGroup("g").Error("failed", "err", pe,
		slog.Group("inner", slog.Any("cause", pe)), "plain", "kept")
	require.NotContains(t, buf.String(), marker)
	require.Contains(t, buf.String(), `"bound":"x: ERROR: data exception`)
	require.Contains(t, buf.String(), `"err":"ERROR: data exception`)
	require.Contains(t, buf.String(), `"inner":{"cause":"ERROR: data exception`)
	require.Contains(t, buf.String(), `"plain":"kept"`)
}

// errValuer logs as the error it holds.
type errValuer struct{ err error }

func (v errValuer) LogValue() slog.Value { return slog.AnyValue(v.err) }

// A record of plain attributes is passed on as it is; one error among them,
// however far down the list, or a LogValuer that resolves to one, is still
// rewritten.
func TestLoggerRewritesAnErrorAmongPlainAttributes(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := Logger(slog.New(slog.NewJSONHandler(&buf, nil)))
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: marker}
	l.LogAttrs(t.Context(), slog.LevelInfo, "plain", slog.String("a", "1"), slog.Int("b", 2), slog.Bool("c", true),
		slog.Float64("d", 1.5), slog.Int64("e", 5), slog.String("f", marker))
	require.Contains(t, buf.String(), `"f":"`+marker+`"`, "a plain string is logged as it is")
	buf.Reset()
	l.Info("late", "a", "1", "b", 2, "c", true, "d", 1.5, "e", int64(5), "f", "six", "err", pe)
	require.NotContains(t, buf.String(), marker)
	require.Contains(t, buf.String(), `"err":"ERROR: data exception`)
	buf.Reset()
	l.Info("valuer", "a", "1", "err", errValuer{pe})
	require.NotContains(t, buf.String(), marker)
	require.Contains(t, buf.String(), `"err":"ERROR: data exception`)
}

// Every request logs one line of strings and numbers through the logger
// (httpapi's serveGroup).
func BenchmarkLoggerRequestLine(b *testing.B) {
	l := Logger(slog.New(slog.NewJSONHandler(io.Discard, nil)))
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		l.LogAttrs(ctx, slog.LevelInfo, "request", slog.String("request_id", "req_01KBN3ZQ0C9Y5T8W2M4R6H7J1E"),
			slog.String("method", "POST"), slog.String("route", "runs.enqueue"), slog.Int("status", 201),
			slog.Int64("ms", 3))
	}
}

// Loggers apply ErrorText to an error, not to the string err.Error() makes
// of it, and the log package and stderr prints know nothing of it: no log
// call in lib/ or functions/ passes err.Error(), and no log.Print* or print
// to stderr passes an error other than through ErrorText or Safe (QA:
// thirteen log calls passed err.Error() and eight prints an error as it
// was, so a value a driver error quoted reached the log).
func TestLogCallsPassErrorsAsErrors(t *testing.T) {
	t.Parallel()
	var found []string
	for _, root := range []string{"../../lib", "../../functions"} {
		require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if testSupport[filepath.Base(filepath.Dir(path))] {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				recv := types.ExprString(sel.X)
				var bad func(ast.Expr) bool
				switch {
				case slogMethods[sel.Sel.Name] && (recv == "slog" || strings.Contains(strings.ToLower(recv), "logger")):
					bad = isErrorCall
				case recv == "log" && strings.HasPrefix(sel.Sel.Name, "Print") || recv == "log" && strings.HasPrefix(sel.Sel.Name, "Fatal"),
					recv == "fmt" && strings.HasPrefix(sel.Sel.Name, "Fprint") && len(call.Args) > 0 &&
						strings.Contains(strings.ToLower(types.ExprString(call.Args[0])), "stderr"):
					bad = func(e ast.Expr) bool { return isErrorCall(e) || isErrIdent(e) }
				default:
					return true
				}
				args := call.Args
				if sel.Sel.Name[0] == 'F' && recv == "fmt" {
					args = args[1:] // the writer
				}
				for _, a := range args {
					if bad(a) {
						found = append(found, fmt.Sprintf("%s: %s", fset.Position(a.Pos()), types.ExprString(a)))
					}
				}
				return true
			})
			return nil
		}))
	}
	require.Empty(t, found, "log errors as errors (a logger's \"err\", err) or through redact.ErrorText")
}

// testSupport are the packages only tests run.
var testSupport = map[string]bool{"apitest": true, "testpg": true, "sdktest": true}

var slogMethods = map[string]bool{"Debug": true, "Info": true, "Warn": true, "Error": true, "Log": true,
	"LogAttrs": true, "DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true}

// isErrorCall: x.Error().
func isErrorCall(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok || len(c.Args) != 0 {
		return false
	}
	s, ok := c.Fun.(*ast.SelectorExpr)
	return ok && s.Sel.Name == "Error"
}

// isErrIdent: a variable named as errors are (err, rerr, openErr).
func isErrIdent(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && (id.Name == "err" || strings.HasSuffix(id.Name, "err") || strings.HasSuffix(id.Name, "Err"))
}

// Parsers quote what they refused: url.Parse a piece of a URL (a password
// holding a "/" reads as a port), time.Parse and time.ParseDuration the
// text, encoding/json an unknown key and a refused number (a map key's
// text too). ErrorText withholds each quoted value and keeps the rest
// (logs QA: each was logged whole).
func TestErrorTextWithholdsWhatParsersQuote(t *testing.T) {
	t.Parallel()
	_, portErr := url.Parse("postgres://ratchet:" + marker + "/rest@db.example/ratchet")
	_, timeErr := time.Parse(time.RFC3339, marker)
	_, durErr := time.ParseDuration(marker)
	_, unitErr := time.ParseDuration("5" + marker)
	var strict struct{ A int }
	dec := json.NewDecoder(strings.NewReader(`{"` + marker + `": 1}`))
	dec.DisallowUnknownFields()
	unknownErr := dec.Decode(&strict)
	var byNumber map[int]int
	keyErr := json.Unmarshal([]byte(`{"`+marker+`": 1}`), &byNumber)
	for _, err := range []error{portErr, timeErr, durErr, unitErr, unknownErr, keyErr} {
		require.Error(t, err)
		require.Contains(t, err.Error(), marker, "the parser quotes the value (else the test holds nothing)")
		got := ErrorText(fmt.Errorf("read: %w", err))
		require.NotContains(t, got, marker)
		require.Contains(t, got, "read: ")
		require.Contains(t, got, "withheld from logs")
	}
	require.Equal(t, `read: parse "(URL withheld from logs)": invalid port (withheld from logs)`,
		ErrorText(fmt.Errorf("read: %w", portErr)))
	require.Equal(t, `parsing time (value withheld from logs) as "2006-01-02T15:04:05Z07:00"`, ErrorText(timeErr))
	require.Equal(t, "json: cannot unmarshal number (value withheld from logs) into Go value of type int", ErrorText(keyErr))

	// An escape and a host's character are a few characters of the URL.
	_, escapeErr := url.Parse("https://hook.example/p%zz")
	require.Equal(t, `parse "(URL withheld from logs)": invalid URL escape (withheld from logs)`, ErrorText(escapeErr))
	_, hostErr := url.Parse("https://ho%st/")
	require.Equal(t, `parse "(URL withheld from logs)": invalid URL escape (withheld from logs)`, ErrorText(hostErr))
	_, hostErr = url.Parse("https://ho st/")
	require.Equal(t, `parse "(URL withheld from logs)": invalid character in host name (withheld from logs)`, ErrorText(hostErr))

	// A refused kind names no value and keeps its text.
	var n int
	kindErr := json.Unmarshal([]byte(`"x"`), &n)
	require.Equal(t, kindErr.Error(), ErrorText(kindErr))
}

// holder holds an error where fmt's %+v writes its text.
type holder struct {
	Name string
	err  error
}

// A handler writes a value that is not an error by fmt's %+v, which writes
// the errors it holds by their own texts and a URL with its password and
// query: Logger withholds a value holding either (an error list, a struct,
// a map, a pointer), writes a URL without them and an error list as
// ErrorText has each (logs QA: each was logged whole), and keeps plain
// values.
func TestLoggerWithholdsErrorsAndURLsInsideOtherValues(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := Logger(slog.New(slog.NewJSONHandler(&buf, nil)))
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: marker}
	hook, err := url.Parse("https://user:" + marker + "@hook.example/in?token=" + marker)
	require.NoError(t, err)
	l.Warn("values", "errs", []error{errors.New("first"), pe}, "held", holder{Name: "n", err: pe},
		"byName", map[string]any{"cause": pe}, "ptr", &holder{err: pe}, "deep", [][]any{{pe}},
		"url", hook, "urlValue", *hook, "escape", []url.EscapeError{url.EscapeError(marker)})
	l.With("bound", map[string]error{"x": pe}).Warn("bound")
	out := buf.String()
	require.NotContains(t, out, marker)
	require.Contains(t, out, `"errs":"[first; ERROR: data exception, its message withheld from logs (SQLSTATE 22P02)]"`)
	require.Contains(t, out, `"held":"a redact.holder, its value withheld from logs (it holds an error or a URL)"`)
	require.Contains(t, out, `"url":"https://…@hook.example/in?…"`)
	require.Contains(t, out, `"urlValue":"https://…@hook.example/in?…"`)
	for _, key := range []string{"byName", "ptr", "deep", "escape", "bound"} {
		require.Contains(t, out, `"`+key+`":"`)
	}

	buf.Reset()
	var nilURL *url.URL
	l.Info("plain", "ids", []string{"a", marker}, "counts", map[string]int{"n": 1}, "held", holder{Name: marker},
		"nilErrs", []error(nil), "nilURL", nilURL, "bytes", []byte("ab"))
	out = buf.String()
	require.Contains(t, out, `"ids":["a","`+marker+`"]`, "plain values are logged as they are")
	require.Contains(t, out, `"held":{"Name":"`+marker+`"}`)
	require.Contains(t, out, `"counts":{"n":1}`)
}
