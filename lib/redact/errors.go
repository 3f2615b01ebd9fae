package redact

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrorText is the text of err that a log line may hold: err.Error() with
// every part that can quote a value withheld. Most errors name only
// statements, tables, constraints and ids, and keep their text; these do
// not:
//
//   - a Postgres data exception (SQLSTATE class 22) quotes the value it
//     refused in its message (`invalid input syntax for type integer:
//     "…"`, `value "…" is out of range`): its message is withheld, its
//     SQLSTATE and routine kept. (A constraint violation's message names
//     the constraint only; the row or key values are in its Detail, which
//     pgconn.PgError's Error never includes.)
//   - an exception a PL/pgSQL RAISE raised (routine exec_stmt_raise, any
//     SQLSTATE) has the message its function formatted, with whatever it
//     was given (jobs_enqueue's `contract % of % not found` names a tool):
//     withheld the same way.
//   - pgx's "unable to encode …" quotes the Go value of the argument it
//     could not send (%#v): withheld whole.
//   - strconv's "parsing \"…\"" quotes its input: the input is withheld.
//   - an HTTP client's *url.Error names its URL, user info (net/http
//     strips the password only) and query string (tokens) included: both
//     are withheld. So is the part url.Parse quotes of a URL it refused (a
//     password holding a "/" reads as a port: `invalid port ":<its
//     first part>" after host`; an escape; a host's character).
//   - time.Parse's *time.ParseError and time.ParseDuration's error quote
//     the text they refused; encoding/json's "unknown field" quotes a key
//     of its input, and its *UnmarshalTypeError the number it refused
//     (a map key's text too): the quoted values are withheld.
//
// Loggers built by Logger apply it to every error they log.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	text := err.Error()
	var lost []string // safe texts of parts whose text the whole does not repeat
	walk(err, func(e error) bool {
		if _, ok := e.(safeError); ok {
			return false // its text is ErrorText's already
		}
		safe, ok := withheld(e)
		if !ok {
			return true
		}
		if old := e.Error(); old != "" && strings.Contains(text, old) {
			text = strings.ReplaceAll(text, old, safe)
		} else {
			lost = append(lost, safe)
		}
		return false
	})
	if len(lost) > 0 {
		// An error that renders what it wraps otherwise than as its text
		// (quoted, cut, reworded) may still hold the value somewhere: say
		// only what the withheld parts were.
		return "error text withheld from logs: " + strings.Join(lost, "; ")
	}
	return text
}

// Safe returns err with its text as ErrorText has it, for an error that
// goes where logs go (a Lambda function's returned error, a command's
// stderr); errors.Is and errors.As still see err. Safe(nil) is nil.
func Safe(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := err.(safeError); ok {
		return s
	}
	return safeError{err: err, text: ErrorText(err)}
}

type safeError struct {
	err  error
	text string
}

func (e safeError) Error() string { return e.text }
func (e safeError) Unwrap() error { return e.err }

// walk calls visit on err and, while visit answers true, on what it wraps.
func walk(err error, visit func(error) bool) {
	if err == nil || !visit(err) {
		return
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		walk(u.Unwrap(), visit)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walk(e, visit)
		}
	}
}

// raiseRoutine is the Routine of an error a PL/pgSQL RAISE raised,
// whatever its SQLSTATE.
const raiseRoutine = "exec_stmt_raise"

// withheld answers the safe text of e when e's own text may quote a value.
func withheld(e error) (string, bool) {
	switch t := e.(type) {
	case *pgconn.PgError:
		what := "data exception"
		switch {
		case t.Routine == raiseRoutine:
			what = "raised exception"
		case !strings.HasPrefix(t.Code, "22"):
			return "", false
		}
		s := t.Severity + ": " + what + ", its message withheld from logs (SQLSTATE " + t.Code
		if t.Routine != "" {
			s += ", routine " + t.Routine
		}
		return s + ")", true
	case *strconv.NumError:
		return "strconv." + t.Func + ": parsing a value withheld from logs: " + t.Err.Error(), true
	case *url.Error:
		// As url.Error's own text has it.
		return fmt.Sprintf("%s %q: %s", t.Op, safeURL(t.URL), ErrorText(t.Err)), true
	case url.EscapeError:
		return "invalid URL escape (withheld from logs)", true
	case url.InvalidHostError:
		return "invalid character in host name (withheld from logs)", true
	case *time.ParseError:
		return "parsing time (value withheld from logs) as " + strconv.Quote(t.Layout), true
	case *json.UnmarshalTypeError:
		// Value is the JSON kind, and for a number (a map key's text
		// too) the text after it: "number 4111…".
		kind, rest, quoted := strings.Cut(t.Value, " ")
		if !quoted || rest == "" {
			return "", false
		}
		return strings.Replace(t.Error(), "unmarshal "+t.Value+" into", "unmarshal "+kind+" (value withheld from logs) into", 1), true
	}
	for _, prefix := range quotingPrefixes {
		if strings.HasPrefix(e.Error(), prefix) {
			return prefix + "(withheld from logs)", true
		}
	}
	// pgx's newEncodeError: "unable to encode %#v into %s format for %s
	// (OID %d): %w", a fmt wrapper and no type of its own.
	if strings.HasPrefix(e.Error(), "unable to encode ") {
		return "unable to encode an argument (value withheld from logs)", true
	}
	return "", false
}

// quotingPrefixes begin the texts of errors of no type of their own that
// quote what they refused after them: url.Parse's port, time.ParseDuration's
// text and unit, encoding/json's unknown key.
var quotingPrefixes = []string{"invalid port ", "time: invalid duration ", "time: unknown unit ",
	"time: missing unit in duration ", "json: unknown field "}

// safeURL is u without its user info, query and fragment.
func safeURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(URL withheld from logs)"
	}
	s := (&url.URL{Scheme: p.Scheme, Host: p.Host, Path: p.Path}).String()
	if p.User != nil {
		s = strings.Replace(s, "://", "://…@", 1)
	}
	if p.RawQuery != "" || p.ForceQuery {
		s += "?…"
	}
	return s
}

// Logger returns l logging every error an attribute holds as ErrorText (a
// nil l is slog's default logger). Every logger Ratchet's services are
// given goes through it, so an error is logged as "err", err, never as
// err.Error(), which would bypass it.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		l = slog.Default()
	}
	if _, ok := l.Handler().(errorHandler); ok {
		return l
	}
	return slog.New(errorHandler{l.Handler()})
}

// errorHandler rewrites error attributes as ErrorText before next sees them.
type errorHandler struct{ next slog.Handler }

func (h errorHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h errorHandler) Handle(ctx context.Context, r slog.Record) error {
	if !mayRewrite(r) {
		// Nothing safeAttr would change (every request's own log line:
		// strings and numbers): passed on as it is, not copied.
		return h.next.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(safeAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h errorHandler) WithAttrs(as []slog.Attr) slog.Handler {
	safe := make([]slog.Attr, len(as))
	for i, a := range as {
		safe[i] = safeAttr(a)
	}
	return errorHandler{h.next.WithAttrs(safe)}
}

func (h errorHandler) WithGroup(name string) slog.Handler {
	return errorHandler{h.next.WithGroup(name)}
}

// mayRewrite says whether safeAttr may change one of r's attributes: only
// a group, a LogValuer or an Any (an error is one) can be changed; it
// answers every other attribute as it is.
func mayRewrite(r slog.Record) bool {
	may := false
	r.Attrs(func(a slog.Attr) bool {
		switch a.Value.Kind() {
		case slog.KindGroup, slog.KindLogValuer, slog.KindAny:
			may = true
		}
		return !may
	})
	return may
}

func safeAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		g := v.Group()
		safe := make([]any, len(g))
		for i, c := range g {
			safe[i] = safeAttr(c)
		}
		return slog.Group(a.Key, safe...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, ErrorText(x))
		case *url.URL:
			if x != nil {
				return slog.String(a.Key, safeURL(x.String()))
			}
		case url.URL:
			return slog.String(a.Key, safeURL(x.String()))
		case []error:
			texts := make([]string, len(x))
			for i, err := range x {
				texts[i] = ErrorText(err)
			}
			return slog.String(a.Key, "["+strings.Join(texts, "; ")+"]")
		default:
			// A handler writes any other value as fmt's %+v, which
			// writes an error it holds (a field, an element) by its own
			// text, and a URL with its password and query (logs QA: a
			// struct, map or slice holding an error logged the value
			// ErrorText withholds).
			if holdsErrorOrURL(reflect.ValueOf(x), 0) {
				return slog.String(a.Key, fmt.Sprintf("a %T, its value withheld from logs (it holds an error or a URL)", x))
			}
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

var (
	errorType = reflect.TypeFor[error]()
	urlType   = reflect.TypeFor[url.URL]()
)

// maxHoldsDepth bounds holdsErrorOrURL's descent; a value nested deeper
// (or a cycle) is taken to hold one.
const maxHoldsDepth = 8

// holdsErrorOrURL says whether v, or anything fmt would print of it, is a
// non-nil error or a url.URL.
func holdsErrorOrURL(v reflect.Value, depth int) bool {
	if !v.IsValid() {
		return false
	}
	if depth > maxHoldsDepth {
		return true
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice:
		if v.IsNil() {
			return false
		}
	}
	if t := v.Type(); t == urlType || t.Implements(errorType) {
		return true
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return holdsErrorOrURL(v.Elem(), depth+1)
	case reflect.Slice, reflect.Array:
		if mayHoldNothing(v.Type().Elem()) {
			return false
		}
		for i := range v.Len() {
			if holdsErrorOrURL(v.Index(i), depth+1) {
				return true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if holdsErrorOrURL(it.Key(), depth+1) || holdsErrorOrURL(it.Value(), depth+1) {
				return true
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if holdsErrorOrURL(v.Field(i), depth+1) {
				return true
			}
		}
	}
	return false
}

// mayHoldNothing says a value of t is a plain one (a number, a string): a
// slice of bytes or of ids need not be walked.
func mayHoldNothing(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return !t.Implements(errorType)
	}
	return false
}

var _ slog.Handler = errorHandler{}
