package jobs

import (
	"encoding/json"
	"reflect"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// An evaluation (checkEvaluations' unit, about 2.4 µs: an anyOf branch
// that fails) is workPerEvaluation units of work. Most keywords cost a
// step or two of it whatever they hold; the ones below cost in proportion
// to what the schema lists or to the value they read, and keywordWork
// counts them (QA, writing the contract-schema fuzz target: a 1 MB string
// checked against "pattern": "(a|aa){1000}b" took 76 s, 2 000 zeros
// against an enum of 20 000 numbers 50 s, 10 000 keys against 4 000
// patternProperties 11 s, each counted as a handful of evaluations). The
// rates are measured on the library (v6), rounded up: a number literal is
// parsed as a big.Rat each time it is compared or bounded, and Go's regexp
// takes the program's size times the text's on a long text.
const (
	workPerEvaluation = 1024
	shortParseWork    = 700 // a short number literal parsed as a big.Rat (part of its evaluation)
	perDigitWork      = 32  // and each character of the literal, which big.Rat reads
	perExponentWork   = 8   // and each power of ten of its exponent, which it expands
	compareWork       = 4   // two values of different kinds or lengths, or two short strings
	perNodeWork       = 128 // hashing or comparing one value inside an array or object
	requiredWork      = 48  // looking one required name up
	matchWork         = 64  // running a regular expression at all
	backtrackWork     = 1   // per instruction and byte, a short text (Go's backtracker)
	nfaWork           = 8   // per instruction and byte, a long one (Go's NFA)
	perRuneWork       = 1   // per byte of a string whose length is checked
	formatWork        = 16  // per byte of a string whose format is checked
	regexFormatWork   = 128 // per byte of a string checked as a regular expression (compiled)
)

// workMemo holds what one count has worked out, as keywordWork asks again
// for each subschema meeting a value: the work of hashing or comparing a
// document's arrays and objects, by their identity, and the size of each
// pattern's program.
type workMemo struct {
	values   map[uintptr]int64
	programs map[string]int64
}

func newWorkMemo() *workMemo {
	return &workMemo{values: map[uintptr]int64{}, programs: map[string]int64{}}
}

// of is the work of hashing or comparing v whole: each value in it, a
// number's parse twice (both sides of a comparison), a long string's bytes.
func (w *workMemo) of(v any) int64 {
	switch v := v.(type) {
	case json.Number:
		return perNodeWork + 2*parseWork(string(v))
	case string:
		return perNodeWork + int64(len(v))/32
	case map[string]any, []any:
		id := reflect.ValueOf(v).Pointer()
		if n, ok := w.values[id]; ok && id != 0 {
			return n
		}
		n := int64(perNodeWork)
		if m, ok := v.(map[string]any); ok {
			for k, child := range m {
				n += int64(len(k))/32 + w.of(child)
			}
		} else {
			for _, child := range v.([]any) {
				n += w.of(child)
			}
		}
		w.values[id] = n
		return n
	}
	return perNodeWork
}

// parseWork is the work of reading number literal lit as a big.Rat.
func parseWork(lit string) int64 {
	n := int64(shortParseWork + perDigitWork*len(lit))
	if _, exp, ok := strings.Cut(strings.ToLower(lit), "e"); ok {
		e, err := strconv.Atoi(strings.TrimPrefix(exp, "+"))
		if err != nil || e > 1<<20 || e < -1<<20 {
			e = 1 << 20 // far beyond what a request may carry (jsonstrict: ±999)
		}
		n += perExponentWork * int64(max(e, -e))
	}
	return n
}

// keywordWork is the work of checking v against s beyond the one
// evaluation checkEvaluations counts for it: the keywords whose cost
// grows with what they list or with v. A keyword that applies a subschema
// is counted by the subschemas it applies; patternProperties by
// checkEvaluations, which tests the patterns itself.
func keywordWork(s *jsonschema.Schema, v any, w *workMemo) int64 {
	var n int64
	if s.Enum != nil {
		for _, item := range s.Enum.Values {
			n += equalsWork(v, item, w)
		}
	}
	if s.Const != nil {
		n += equalsWork(v, *s.Const, w)
	}
	switch v := v.(type) {
	case json.Number:
		if s.Minimum != nil || s.Maximum != nil || s.ExclusiveMinimum != nil || s.ExclusiveMaximum != nil ||
			(s.Types != nil && slices.Contains(s.Types.ToStrings(), "integer")) {
			n += parseWork(string(v)) - shortParseWork
		}
		if s.MultipleOf != nil {
			n += 2 * parseWork(string(v)) // its parse, and a division as costly
		}
	case string:
		if s.MinLength != nil || s.MaxLength != nil {
			n += perRuneWork * int64(len(v))
		}
		if s.Pattern != nil {
			n += w.regex(s.Pattern.String(), len(v))
		}
		switch {
		case s.Format == nil:
		case s.Format.Name == "regex":
			n += regexFormatWork * int64(len(v))
		default:
			n += formatWork * int64(len(v))
		}
	case map[string]any:
		n += requiredWork * int64(len(s.Required))
		for name, names := range s.DependentRequired {
			if _, ok := v[name]; ok {
				n += requiredWork * int64(len(names))
			}
		}
		for name, d := range s.Dependencies {
			if names, ok := d.([]string); ok {
				if _, ok := v[name]; ok {
					n += requiredWork * int64(len(names))
				}
			}
		}
	case []any:
		if s.UniqueItems {
			n += w.of(v)
		}
	}
	return n
}

// equalsWork is the work of comparing value v with a schema's value c
// (an enum's, a const): each number parsed, the smaller of two arrays or
// objects of the same length walked.
func equalsWork(v, c any, w *workMemo) int64 {
	switch v := v.(type) {
	case json.Number:
		if c, ok := c.(json.Number); ok {
			return parseWork(string(v)) + parseWork(string(c))
		}
	case string:
		if c, ok := c.(string); ok && len(c) == len(v) {
			return compareWork + int64(len(v))/32
		}
	case map[string]any:
		if c, ok := c.(map[string]any); ok && len(c) == len(v) {
			return min(w.of(v), w.of(c))
		}
	case []any:
		if c, ok := c.([]any); ok && len(c) == len(v) {
			return min(w.of(v), w.of(c))
		}
	}
	return compareWork
}

// regex is the work of matching a text of n bytes against pattern.
func (w *workMemo) regex(pattern string, n int) int64 {
	insts, ok := w.programs[pattern]
	if !ok {
		insts = int64(programSize(pattern))
		w.programs[pattern] = insts
	}
	size := insts * int64(n+1)
	if insts <= 500 && size <= 256<<10 {
		return matchWork + backtrackWork*size // within Go's bit-state backtracker
	}
	return matchWork + nfaWork*size
}

// programs holds the size of compiled patterns, by pattern, for every
// count: a schema holds at most MaxSchemaParts of them, so the bound
// keeps those of a dozen such schemas at once (a smaller one, cleared
// when full, made a count of a schema with more patterns compile them
// again and again).
var programs = struct {
	sync.Mutex
	m map[string]int
}{m: map[string]int{}}

const maxPrograms = 1 << 16

// programSize is how many instructions Go's regexp compiles pattern to
// (one pattern the compiler took; 1 if it cannot say).
func programSize(pattern string) int {
	programs.Lock()
	n, ok := programs.m[pattern]
	programs.Unlock()
	if ok {
		return n
	}
	n = 1
	if re, err := syntax.Parse(pattern, syntax.Perl); err == nil {
		if prog, err := syntax.Compile(re.Simplify()); err == nil {
			n = max(1, len(prog.Inst))
		}
	}
	programs.Lock()
	if len(programs.m) >= maxPrograms {
		clear(programs.m)
	}
	programs.m[pattern] = n
	programs.Unlock()
	return n
}
