package jobs

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Contract schemas are JSON Schema 2020-12 (a schema may name another draft
// with $schema). They are compiled at publication, so a stored schema always
// compiles; enqueue, report and replay compile them again through a small
// content-addressed cache (a schema's compiled form depends only on its bytes).

// schemaURL is the base URL a contract schema is compiled under. References
// resolve only inside the document: remote and file URLs are refused, and so
// is a relative one naming another document ("other.json"), which resolves
// against this hierarchical base to a URL the loader refuses (QA: under a
// URN base it resolved to the schema's own root, so a contract published as
// {"$ref":"other.json"} refused every input, silently). A relative $id of an
// embedded resource, and a $ref to it, resolve inside the document.
const schemaURL = "https://contract-schema.ratchet.invalid/published-contract-schema-f3a91c"

// legacySchemaURL is the base schemas were compiled under before: a stored
// schema with a relative reference to another document compiles only under
// it, and keeps the meaning it had when it was published (contracts are
// immutable), rather than failing every enqueue.
const legacySchemaURL = "urn:ratchet:contract-schema"

// maxValidationProblems bounds detail.validation for one document.
const maxValidationProblems = 20

// noLoader refuses every external reference: a schema must be self-contained
// (the compiler's default would read local files).
type noLoader struct{}

func (noLoader) Load(string) (any, error) { return nil, errExternalReference }

// errExternalReference is noLoader's refusal. It does not repeat the
// reference: an error names what is wrong, never the value sent (security
// QA: a $ref's URL came back twice in the message).
var errExternalReference = errors.New("external references are not allowed: a schema must be self-contained")

// errUnsupportedDialect is a $schema naming no dialect the compiler reads:
// JSON Schema 2020-12, or an earlier draft by its json-schema.org URL. The
// compiler asks the loader for any other $schema URL as a meta-schema,
// which noLoader refuses like any other document (QA: that refusal read
// as a $ref to another document in a schema with no $ref). Like
// errExternalReference, it does not repeat the URL.
var errUnsupportedDialect = errors.New(`its $schema names a dialect this service does not support: use JSON ` +
	`Schema 2020-12 ("https://json-schema.org/draft/2020-12/schema", or leave $schema out), or an earlier draft ` +
	`by its json-schema.org URL (2019-09, draft-07, draft-06, draft-04)`)

// compileSchema compiles a schema document given as JSON, as publication
// checks it.
func compileSchema(doc []byte) (*jsonschema.Schema, error) {
	return compileSchemaAt(doc, schemaURL)
}

// publishableSchema is how publication checks a schema: it compiles, and
// no part of it applies itself to the value it checks, through $ref (or
// $dynamicRef, $recursiveRef) and the keywords that apply a subschema to
// the same value (allOf, anyOf, oneOf, not, if/then/else, dependent
// schemas) without moving to a child value. Checking such a part needs
// checking it first: the library answers a reference cycle for every value
// that reaches it, so a contract with one refused its enqueues or reports
// (review: {"$id":"urn:x","$ref":"other.json"}, a relative reference
// resolved against the schema's own URN, or {"type":"object","$ref":"#"}).
// Recursion through properties, items and the like moves to a child value
// each time, and is ordinary.
func publishableSchema(doc []byte) error {
	s, err := compileSchema(doc)
	if err != nil {
		return err
	}
	if evaluationsPerValue(s, MaxSchemaEvaluations) > MaxSchemaEvaluations {
		return fmt.Errorf("checking a value against it could evaluate more than %d subschemas ($ref and allOf, "+
			"anyOf, oneOf reaching the same parts again and again): share fewer parts, or flatten them",
			MaxSchemaEvaluations)
	}
	if err := countBeyondInt(s, doc); err != nil {
		return err
	}
	state := map[*jsonschema.Schema]int{}
	if slices.ContainsFunc(reachable(s), func(part *jsonschema.Schema) bool { return appliesItself(part, state) }) {
		return errors.New("a $ref loop applies a part of it to the same value it is checking (through $ref, " +
			"allOf, anyOf, oneOf, not or if), so no value reaching it can be checked: a recursive $ref must " +
			"go through properties or items")
	}
	return nil
}

// countKeywords state a count: a length, or a number of items, properties
// or contained items.
var countKeywords = []string{"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
	"minContains", "maxContains"}

// countBeyondInt refuses a count keyword of a part of s (schema document
// doc, each part read at its location) whose integer an int64 does not
// hold: the compiler keeps a count in an int, reading a larger integer as
// its low 64 bits (contract QA: {"maxLength": 1e300} refused every string
// as longer than 0 characters, {"minLength": 18446744073709551616} took
// the empty string). The metaschema has checked each is an integer of at
// least 0; a count no part applies (a constant's data) is not read.
func countBeyondInt(s *jsonschema.Schema, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	for _, part := range reachable(s) {
		_, frag, _ := strings.Cut(part.Location, "#")
		ptr, err := url.PathUnescape(frag)
		if err != nil {
			continue
		}
		obj, _ := atPointer(v, ptr).(map[string]any)
		for _, k := range countKeywords {
			n, ok := obj[k].(json.Number)
			if !ok {
				continue
			}
			if r, ok := new(big.Rat).SetString(string(n)); ok && r.IsInt() && !r.Num().IsInt64() {
				return fmt.Errorf("%s at %q is %s: a count must be at most %d", k, "#"+ptr, n, math.MaxInt64)
			}
		}
	}
	return nil
}

// atPointer is the value at JSON pointer ptr in v (RFC 6901), nil when
// there is none.
func atPointer(v any, ptr string) any {
	if ptr == "" {
		return v
	}
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			v = x[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// sameValue lists the subschemas s applies to the value s checks itself.
func sameValue(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else}
	if s.DynamicRef != nil {
		out = append(out, s.DynamicRef.Ref)
	}
	out = append(append(append(out, s.AllOf...), s.AnyOf...), s.OneOf...)
	for _, d := range s.DependentSchemas {
		out = append(out, d)
	}
	for _, d := range s.Dependencies {
		if d, ok := d.(*jsonschema.Schema); ok {
			out = append(out, d)
		}
	}
	return out
}

// reachable lists every subschema of s, s included, whatever value each
// applies to.
func reachable(s *jsonschema.Schema) []*jsonschema.Schema {
	seen := map[*jsonschema.Schema]bool{}
	var out []*jsonschema.Schema
	var walk func(*jsonschema.Schema)
	walk = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		out = append(out, s)
		for _, next := range append(sameValue(s), childValues(s)...) {
			walk(next)
		}
	}
	walk(s)
	return out
}

// childValues lists the subschemas s applies to values inside the one it
// checks (properties, items, …).
func childValues(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.PropertyNames, s.UnevaluatedProperties, s.Contains, s.Items2020,
		s.UnevaluatedItems, s.ContentSchema}
	for _, p := range s.Properties {
		out = append(out, p)
	}
	for _, p := range s.PatternProperties {
		out = append(out, p)
	}
	out = append(out, s.PrefixItems...)
	for _, v := range []any{s.AdditionalProperties, s.Items, s.AdditionalItems} {
		switch v := v.(type) {
		case *jsonschema.Schema:
			out = append(out, v)
		case []*jsonschema.Schema:
			out = append(out, v...)
		}
	}
	return out
}

// appliesItself reports whether a cycle of sameValue links is reachable
// from s (state: 1 on the current path, 2 done).
func appliesItself(s *jsonschema.Schema, state map[*jsonschema.Schema]int) bool {
	if s == nil || state[s] == 2 {
		return false
	}
	if state[s] == 1 {
		return true
	}
	state[s] = 1
	for _, next := range sameValue(s) {
		if appliesItself(next, state) {
			return true
		}
	}
	state[s] = 2
	return false
}

// possibleSubschemas counts the values of JSON document doc that could be
// subschemas, its objects and booleans (strings do not count), stopping
// once it passes max.
func possibleSubschemas(doc []byte, max int) int {
	n := 0
	jsonx.OutsideStrings(doc, func(c byte) bool {
		if c == '{' || c == 't' || c == 'f' {
			n++
		}
		return n > max
	})
	return n
}

// compileEvaluations is what compiling schema costs, in evaluations (about
// 2.4 µs each, see MaxCheckEvaluations): measured, a schema of one part
// took about 50 µs, and each part about 25-30 µs more (0.16 s for 5 000),
// counted here as 20 and 12; its bytes are counted too, one evaluation for
// 256 of them, for a schema that is mostly long strings.
func compileEvaluations(schema []byte) int64 {
	return compileBaseEvaluations + 12*int64(possibleSubschemas(schema, MaxSchemaParts)) +
		int64(len(schema))/compileBytesPerEvaluation
}

// compileBaseEvaluations and compileBytesPerEvaluation are the parts of
// compileEvaluations that sqlReplayOlderTargets counts, in the database,
// to read only the schemas a replay preview's budget left may reach.
const (
	compileBaseEvaluations    = 20
	compileBytesPerEvaluation = 256
)

// evaluationsPerValue bounds how many subschemas checking one value against
// s may evaluate, stopping once it passes max: each subschema counts once
// plus what it applies, to the same value or to those inside it, so a
// part reached twice counts twice (QA: 27 levels of $defs, each applying
// the next twice through allOf, 1.7 kB, made one enqueue evaluate 2^27
// subschemas, minutes of CPU past the request's deadline). Recursion back
// into a part being counted counts once: it moves to a child value each
// time (publishableSchema refuses the rest), so the input bounds it.
func evaluationsPerValue(s *jsonschema.Schema, max int64) int64 {
	counted := map[*jsonschema.Schema]int64{}
	onPath := map[*jsonschema.Schema]bool{}
	var count func(*jsonschema.Schema) int64
	count = func(s *jsonschema.Schema) int64 {
		switch {
		case s == nil:
			return 0
		case onPath[s]:
			return 1
		}
		if n, ok := counted[s]; ok {
			return n
		}
		onPath[s] = true
		n := int64(1)
		for _, next := range append(sameValue(s), childValues(s)...) {
			if n += count(next); n > max {
				n = max + 1
				break
			}
		}
		onPath[s] = false
		counted[s] = n
		return n
	}
	return count(s)
}

// checkEvaluations bounds how many subschemas checking value v against s
// evaluates, stopping once it passes max: each subschema once per value it
// applies to, the keywords that move to a child value followed to the
// children they apply to (properties by name, patternProperties by match,
// additionalProperties to the rest, items and prefixItems by index), and
// the rest counted as if every branch ran (anyOf, if/then/else...). The
// per-value bound of publication (evaluationsPerValue) does not bound a
// document: a 600-byte array of 200 values, each failing an anyOf of 4 990
// branches, took 2.4 s; 20 000 such values ran for minutes and tens of
// GiB before the process was killed (review). A keyword whose cost grows
// with what it lists or the value it reads (an enum, a pattern, required
// names) adds its work, in evaluations (keywordWork), and so does each
// pattern of patternProperties this count tests a name against.
func checkEvaluations(s *jsonschema.Schema, v any, max int64) int64 {
	var n, work int64
	memo := newWorkMemo()
	over := func() bool { return n+work/workPerEvaluation > max }
	var walk func(s *jsonschema.Schema, v any)
	walk = func(s *jsonschema.Schema, v any) {
		if s == nil || over() {
			return
		}
		n++
		work += keywordWork(s, v, memo)
		for _, next := range sameValue(s) {
			walk(next, v)
		}
		switch v := v.(type) {
		case map[string]any:
			// Each name is tested against every pattern: the tests' fixed
			// part is counted at once, so that an object past the bound on
			// it alone is refused before any test runs.
			if work += matchWork * int64(len(v)) * int64(len(s.PatternProperties)); over() {
				return
			}
			additional, _ := s.AdditionalProperties.(*jsonschema.Schema)
			for name, child := range v {
				if over() {
					return
				}
				walk(s.PropertyNames, name)
				walk(s.UnevaluatedProperties, child)
				p, matched := s.Properties[name]
				walk(p, child)
				for re, p := range s.PatternProperties {
					if work += memo.regex(re.String(), len(name)) - matchWork; over() {
						return
					}
					if re.MatchString(name) {
						matched = true
						walk(p, child)
					}
				}
				if !matched {
					walk(additional, child)
				}
			}
		case []any:
			for i, child := range v {
				walk(s.Contains, child)
				walk(s.UnevaluatedItems, child)
				walk(itemSchema(s, i), child)
			}
		case string:
			walk(s.ContentSchema, nil) // the decoded content: at least one evaluation
		}
	}
	walk(s, v)
	return n + work/workPerEvaluation
}

// itemSchema is the subschema s applies to the array element at index i:
// prefixItems then items (2020-12), or items as a list then
// additionalItems, or items as one schema (earlier drafts).
func itemSchema(s *jsonschema.Schema, i int) *jsonschema.Schema {
	if i < len(s.PrefixItems) {
		return s.PrefixItems[i]
	}
	if s.Items2020 != nil {
		return s.Items2020
	}
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		return items
	case []*jsonschema.Schema:
		if i < len(items) {
			return items[i]
		}
		additional, _ := s.AdditionalItems.(*jsonschema.Schema)
		return additional
	}
	return nil
}

// nestsDeeperThan reports whether JSON document doc nests objects and
// arrays more than max levels deep (brackets inside strings do not count),
// stopping at the first level too deep.
func nestsDeeperThan(doc []byte, max int) bool {
	depth := 0
	jsonx.OutsideStrings(doc, func(c byte) bool {
		switch c {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		return depth > max
	})
	return depth > max
}

// compileStoredSchema compiles a published schema: as publication does, or,
// for one published before schemaURL, as it was then.
func compileStoredSchema(doc []byte) (*jsonschema.Schema, error) {
	s, err := compileSchema(doc)
	if err != nil {
		if legacy, lerr := compileSchemaAt(doc, legacySchemaURL); lerr == nil {
			return legacy, nil
		}
	}
	return s, err
}

func compileSchemaAt(doc []byte, base string) (*jsonschema.Schema, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	err = c.AddResource(base, v)
	var s *jsonschema.Schema
	if err == nil {
		s, err = c.Compile(base)
	}
	if err != nil && refusesDialect(v, err) {
		return nil, errUnsupportedDialect
	}
	return s, err
}

// refusesDialect reports whether err refuses a $schema of document v: one
// of the compiler's own refusals of a $schema, or the loader's refusal of a
// URL one of v's "$schema" keywords names (a $ref naming the very same URL
// as a "$schema" string elsewhere in v would read as this too).
func refusesDialect(v any, err error) bool {
	var draft *jsonschema.UnsupportedDraftError
	var cycle *jsonschema.MetaSchemaCycleError
	var invalid *jsonschema.InvalidMetaSchemaURLError
	if errors.As(err, &draft) || errors.As(err, &cycle) || errors.As(err, &invalid) {
		return true
	}
	var load *jsonschema.LoadURLError
	if !errors.As(err, &load) {
		return false
	}
	return namesMetaSchema(v, load.URL)
}

// namesMetaSchema reports whether a "$schema" keyword in document v names
// url, without its fragment, as the compiler loads it.
func namesMetaSchema(v any, url string) bool {
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			if u, ok := child.(string); ok && k == "$schema" {
				if u, _, _ = strings.Cut(u, "#"); u == url {
					return true
				}
			}
			if namesMetaSchema(child, url) {
				return true
			}
		}
	case []any:
		for _, child := range v {
			if namesMetaSchema(child, url) {
				return true
			}
		}
	}
	return false
}

// schemaCache holds compiled schemas by the SHA-256 of their JSON. It is an
// optimisation only: a miss recompiles. It is cleared when full.
type schemaCache struct {
	mu sync.Mutex
	m  map[[32]byte]*jsonschema.Schema
}

const schemaCacheMax = 512

var schemas = &schemaCache{m: map[[32]byte]*jsonschema.Schema{}}

func (c *schemaCache) get(doc []byte) (*jsonschema.Schema, error) {
	k := sha256.Sum256(doc)
	c.mu.Lock()
	s := c.m[k]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := compileStoredSchema(doc)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.m) >= schemaCacheMax {
		clear(c.m)
	}
	c.m[k] = s
	c.mu.Unlock()
	return s, nil
}

// validateDoc checks the JSON document doc against a stored schema and
// answers the problems with fields rooted at root ("input", "output"). The
// messages name the rule broken and never quote the document's values, so
// they are safe to return and to store.
func validateDoc(schema, doc []byte, root string) ([]apierr.FieldError, error) {
	problems, _, err := validateDocWithin(schema, doc, root, MaxCheckEvaluations)
	return problems, err
}

// errOverBudget is validateDocWithin's answer for a document it did not
// check: its check could evaluate more subschemas than the budget left.
var errOverBudget = errors.New("checking the document could pass the evaluations left")

// validateDocWithin is validateDoc held to budget evaluations (at most
// MaxCheckEvaluations): it answers the evaluations it counted
// (checkEvaluations, which stops past budget), the work the check cost and
// bounds, and errOverBudget, having checked nothing, for a document whose
// check could take more than a budget below MaxCheckEvaluations (one that
// could take more than MaxCheckEvaluations is refused as validateDoc
// refuses it). A caller checking one document against many schemas spends
// one budget over them all (the replay preview).
func validateDocWithin(schema, doc []byte, root string, budget int64) ([]apierr.FieldError, int64, error) {
	s, err := schemas.get(schema)
	if err != nil {
		return nil, 0, fmt.Errorf("stored contract schema does not compile: %w", err)
	}
	if nestsDeeperThan(doc, MaxCheckedDepth) {
		return []apierr.FieldError{{Field: root, Message: fmt.Sprintf(
			"nests objects and arrays more than %d levels deep, too deep to check against the contract's schema",
			MaxCheckedDepth)}}, 0, nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return []apierr.FieldError{{Field: root, Message: "must be JSON"}}, 0, nil
	}
	n := checkEvaluations(s, v, budget)
	switch {
	case n > budget && budget < MaxCheckEvaluations:
		return nil, n, errOverBudget
	case n > budget:
		return []apierr.FieldError{{Field: root, Message: fmt.Sprintf(
			"is too large to check against the contract's schema: checking it could evaluate more than %d "+
				"subschemas (send fewer values, or publish a schema with fewer alternatives per value)",
			MaxCheckEvaluations)}}, n, nil
	}
	if err = validateSafely(s, v); errors.Is(err, errUncheckable) {
		return []apierr.FieldError{{Field: root, Message: "holds a number the schema check cannot read"}}, n, nil
	}
	if err == nil {
		return nil, n, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return nil, n, fmt.Errorf("validate: %w", err)
	}
	return leafProblems(ve, root, "does not match the schema", false), n, nil
}

// leafProblems flattens a validation error tree into its leaves' problems,
// fields rooted at root, sorted, without repeats and at most
// maxValidationProblems; fallback is the root's message when no leaf
// names one. meta says the tree is a schema's check against its
// meta-schema, whose enums (its keywords' values) may be quoted.
func leafProblems(ve *jsonschema.ValidationError, root, fallback string, meta bool) []apierr.FieldError {
	var out []apierr.FieldError
	collectProblems(ve, root, meta, &out)
	if len(out) == 0 {
		out = append(out, apierr.FieldError{Field: root, Message: fallback})
	}
	slices.SortStableFunc(out, func(a, b apierr.FieldError) int { return compareFields(a.Field, b.Field) })
	out = slices.CompactFunc(out, func(a, b apierr.FieldError) bool { return a == b })
	if len(out) > maxValidationProblems {
		out = out[:maxValidationProblems]
	}
	// A path holds the document's own keys, which may be as long as the
	// document: each is cut as every refusal cuts its fields (size QA: a
	// rejected output's reason, stored on its attempt, held its keys whole).
	for i := range out {
		out[i].Field = apierr.CutField(out[i].Field)
	}
	return out
}

// compareFields orders dotted field paths segment by segment, array
// indexes by number: input.items.2 before input.items.10, so the problems
// kept under maxValidationProblems are the first items' (contract QA: as
// text, items 10-19 came before 2-9).
func compareFields(a, b string) int {
	for a != "" || b != "" {
		var x, y string
		x, a, _ = strings.Cut(a, ".")
		y, b, _ = strings.Cut(b, ".")
		if c := compareSegments(x, y); c != 0 {
			return c
		}
	}
	return 0
}

func compareSegments(x, y string) int {
	i, errX := strconv.ParseUint(x, 10, 64)
	j, errY := strconv.ParseUint(y, 10, 64)
	switch {
	case errX == nil && errY == nil:
		return cmp.Compare(i, j)
	case errX == nil:
		return -1 // an index before a name
	case errY == nil:
		return 1
	}
	return strings.Compare(x, y)
}

// metaSchemaProblems says where a published schema breaks the rules of
// its dialect (its meta-schema): a field path into the schema and the rule,
// as an input's problems say them (QA: every such schema, a "type" of
// "strin", "required": "a", a lookahead in a "pattern", was told the same
// first line of the library's message, naming neither keyword nor place).
// nil when err is another refusal.
func metaSchemaProblems(field string, err error) []apierr.FieldError {
	var sve *jsonschema.SchemaValidationError
	if !errors.As(err, &sve) {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(sve.Err, &ve) {
		return nil
	}
	out := leafProblems(ve, field, "does not match the JSON Schema meta-schema", true)
	for i := range out {
		out[i].Message = "is not valid JSON Schema (2020-12, or the draft its $schema names): " + out[i].Message
	}
	return out
}

// MaxCheckedDepth bounds how deeply an input or output checked against a
// contract schema may nest objects and arrays. Against a recursive schema
// ({"$ref"} through properties) the validator walks the whole depth, and a
// value it refuses costs time and memory quadratic in it (QA follow-up: 10 000
// levels, a 50 kB input, took 1 s and allocated 800 MiB; 1 000 levels take
// milliseconds). A document without a contract is never walked so.
const MaxCheckedDepth = 1000

// errUncheckable is a document the validator could not check.
var errUncheckable = errors.New("document cannot be checked")

// validateSafely validates v, answering errUncheckable where the validator
// panics: it reads a number whose exponent big.Rat refuses (1e-1000001) as a
// nil rational (fuzzing). Requests refuse such numbers (jsonstrict), but an
// input stored before they did may be checked again by a replay.
func validateSafely(s *jsonschema.Schema, v any) (err error) {
	defer func() {
		if recover() != nil {
			err = errUncheckable
		}
	}()
	return s.Validate(v)
}

// collectProblems flattens the leaves of a validation error tree, a value
// that fails every alternative of an anyOf or oneOf told once
// (alternativesProblem).
func collectProblems(ve *jsonschema.ValidationError, root string, meta bool, out *[]apierr.FieldError) {
	told := len(*out)
	if p, ok := alternativesProblem(ve, root, meta, out); ok {
		*out = append(*out, p)
		return
	} else if len(*out) > told {
		return // told as the alternatives for its kind of value say
	}
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			collectProblems(c, root, meta, out)
		}
		return
	}
	field := dotted(root, ve.InstanceLocation)
	switch k := ve.ErrorKind.(type) {
	case *kind.Required:
		for _, m := range k.Missing {
			*out = append(*out, apierr.FieldError{Field: dotted(field, []string{m}), Message: "is required"})
		}
	case *kind.AdditionalProperties:
		for _, p := range k.Properties {
			*out = append(*out, apierr.FieldError{Field: dotted(field, []string{p}),
				Message: "is not allowed by the schema"})
		}
	case *kind.Type:
		*out = append(*out, apierr.FieldError{Field: field,
			Message: fmt.Sprintf(typeRulePrefix+"%s (got %s)", strings.Join(k.Want, " or "), k.Got)})
	case *kind.MinLength:
		*out = append(*out, apierr.FieldError{Field: field, Message: fmt.Sprintf("must be at least %d characters", k.Want)})
	case *kind.MaxLength:
		*out = append(*out, apierr.FieldError{Field: field, Message: fmt.Sprintf("must be at most %d characters", k.Want)})
	case *kind.Minimum:
		*out = append(*out, apierr.FieldError{Field: field, Message: "must be at least " + ratString(k.Want)})
	case *kind.Maximum:
		*out = append(*out, apierr.FieldError{Field: field, Message: "must be at most " + ratString(k.Want)})
	case *kind.Format:
		// A meta-schema's (an input's formats are annotations): a
		// "pattern" the regexp engine refuses, say. The value is not quoted.
		msg := "must be a valid " + k.Want
		if k.Want == "regex" {
			msg += " (RE2 syntax, as Go's regexp reads it: no lookaround or backreferences)"
		}
		*out = append(*out, apierr.FieldError{Field: field, Message: msg})
	case *kind.Enum:
		*out = append(*out, apierr.FieldError{Field: field, Message: enumMessage(k, meta)})
	case *kind.Const:
		*out = append(*out, apierr.FieldError{Field: field, Message: "must be one of the values the schema allows"})
	case *kind.FalseSchema:
		*out = append(*out, apierr.FieldError{Field: field, Message: "is not allowed by the schema"})
	case *kind.Not:
		// Its keyword path is empty (the validator's), which read as "".
		*out = append(*out, apierr.FieldError{Field: field, Message: `matches what the schema's "not" rule forbids`})
	default:
		msg := "does not match the schema"
		if kw := strings.Join(ve.ErrorKind.KeywordPath(), "/"); kw != "" {
			msg = fmt.Sprintf("fails the schema's %q rule", kw)
		}
		*out = append(*out, apierr.FieldError{Field: field, Message: msg})
	}
}

// enumMessage says what an enum allows: for a meta-schema's (the values
// of a keyword such as "type"), its values; for a contract's, not them (a
// message names the rule, never what the schema or document holds).
func enumMessage(k *kind.Enum, meta bool) string {
	const plain = "must be one of the values the schema allows"
	if !meta {
		return plain
	}
	want := make([]string, 0, len(k.Want))
	for _, v := range k.Want {
		switch v.(type) {
		case []any, map[string]any:
			return plain
		}
		b, err := jsonx.Marshal(v)
		if err != nil {
			return plain
		}
		want = append(want, string(b))
	}
	return "must be one of " + strings.Join(want, ", ")
}

// alternativesProblem tells a value that fails every alternative of an
// anyOf, or of a oneOf that none matches, as one problem when each
// alternative's problems are the value's own (none deeper in it): the
// alternatives' rules joined by "or", the types they want as one (QA: a
// schema's {"type":"nope"} was told two problems for one field, one for
// each alternative of the meta-schema's "type", and an input of the wrong
// type for an anyOf of two types one for each). Alternatives for another
// kind of value than the value's are left out when some are for its kind
// (wrongKind): when those name problems deeper in the value, they are
// appended to out as they are. ok is false but then, and when the
// alternatives' problems are to be told as they are.
func alternativesProblem(ve *jsonschema.ValidationError, root string, meta bool, out *[]apierr.FieldError) (p apierr.FieldError, ok bool) {
	switch k := ve.ErrorKind.(type) {
	case *kind.AnyOf:
	case *kind.OneOf:
		if len(k.Subschemas) > 0 {
			return p, false // more than one matched
		}
	default:
		return p, false
	}
	if len(ve.Causes) == 0 {
		return p, false
	}
	field := dotted(root, ve.InstanceLocation)
	// An alternative for another kind of value is not what the value
	// missed when another is for its kind ({"type":["nope"]}: not the
	// type name, but an array of them, whose item is wrong).
	causes := slices.DeleteFunc(slices.Clone(ve.Causes), wrongKind)
	if len(causes) == 0 {
		causes = ve.Causes
	}
	var each []apierr.FieldError
	for _, c := range causes {
		collectProblems(c, root, meta, &each)
	}
	if len(causes) < len(ve.Causes) && slices.ContainsFunc(each, func(e apierr.FieldError) bool {
		return e.Field != field
	}) {
		*out = append(*out, each...)
		return p, false
	}
	var types []string
	got := ""
	var rules []string
	for _, e := range each {
		if e.Field != field {
			return p, false
		}
		if want, g, isType := typeRule(e.Message); isType && (got == "" || g == got) {
			got = g
			types = append(types, want)
			continue
		}
		rules = append(rules, e.Message)
	}
	if len(types) > 0 {
		types = slices.Compact(types)
		rules = append([]string{fmt.Sprintf(typeRulePrefix+"%s (got %s)", strings.Join(types, " or "), got)},
			rules...)
	}
	seen := map[string]bool{}
	rules = slices.DeleteFunc(rules, func(r string) bool { told := seen[r]; seen[r] = true; return told })
	if len(rules) == 0 {
		return p, false
	}
	msg := rules[0]
	if len(rules) > 1 && slices.ContainsFunc(rules, func(r string) bool { return !strings.HasPrefix(r, "must ") }) {
		// A rule said as a failure ("fails the schema's ... rule") is no
		// requirement to offer as an alternative.
		msg = fmt.Sprintf("matches none of the alternatives of the schema's %q rule: it %s",
			ve.ErrorKind.KeywordPath()[0], strings.Join(rules, "; it "))
	} else {
		for _, r := range rules[1:] {
			msg += ", or " + strings.TrimPrefix(r, "must ")
		}
	}
	return apierr.FieldError{Field: field, Message: msg}, true
}

// wrongKind says an alternative fails only for the value's kind: its type,
// or an enum of no value of its kind (through a $ref, allOf or the like
// of one cause).
func wrongKind(ve *jsonschema.ValidationError) bool {
	for len(ve.Causes) == 1 {
		ve = ve.Causes[0]
	}
	switch k := ve.ErrorKind.(type) {
	case *kind.Type:
		return len(ve.Causes) == 0
	case *kind.Enum:
		return len(ve.Causes) == 0 && !slices.ContainsFunc(k.Want, func(w any) bool { return kindOf(w) == kindOf(k.Got) })
	}
	return false
}

// kindOf names the JSON kind of a decoded value.
func kindOf(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	}
	return "number"
}

// typeRule reads a type problem's message back: the types it wants and
// the one it got.
func typeRule(msg string) (want, got string, ok bool) {
	rest, ok := strings.CutPrefix(msg, typeRulePrefix)
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, " (got ")
	if i < 0 || !strings.HasSuffix(rest, ")") {
		return "", "", false
	}
	return rest[:i], rest[i+len(" (got ") : len(rest)-1], true
}

const typeRulePrefix = "must be of type "

// ratString writes a schema bound as a plain number.
func ratString(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	return strings.TrimRight(strings.TrimRight(r.FloatString(9), "0"), ".")
}

func dotted(root string, loc []string) string {
	if len(loc) == 0 {
		return root
	}
	return root + "." + strings.Join(loc, ".")
}

// schemaCompileProblem describes why a schema does not compile without
// quoting it, nor the URL it is compiled under (schemaURL, an
// implementation detail: QA, {"$ref":"#/nonexist"} was told
// `json-pointer in "schema#/nonexist" not found`).
func schemaCompileProblem(err error) string {
	const prefix = "must be a valid JSON Schema (2020-12, or the draft its $schema names): "
	var (
		load      *jsonschema.LoadURLError
		pointer   *jsonschema.JSONPointerNotFoundError
		badPtr    *jsonschema.InvalidJsonPointerError
		anchor    *jsonschema.AnchorNotFoundError
		dupID     *jsonschema.DuplicateIDError
		dupAnchor *jsonschema.DuplicateAnchorError
		parseID   *jsonschema.ParseIDError
		parseAnc  *jsonschema.ParseAnchorError
	)
	switch {
	case errors.Is(err, errUnsupportedDialect):
		return "must be a valid JSON Schema: " + errUnsupportedDialect.Error()
	case errors.As(err, &load):
		// The library's message quotes the URL it could not load.
		return prefix + "it has a $ref to another document; " + errExternalReference.Error()
	case errors.As(err, &pointer), errors.As(err, &badPtr), errors.As(err, &anchor):
		return prefix + "a $ref names a part of the schema that it does not hold: name one by its JSON " +
			`pointer from the schema's root ("#/$defs/name") or by an $anchor it declares ("#name")`
	case errors.As(err, &dupID):
		return prefix + "two of its subschemas declare the same $id"
	case errors.As(err, &dupAnchor):
		return prefix + "two of its subschemas declare the same $anchor"
	case errors.As(err, &parseID):
		return prefix + "an $id of it is not a valid URI reference"
	case errors.As(err, &parseAnc):
		return prefix + "an $anchor of it is not a valid anchor name"
	}
	msg := err.Error()
	if i := strings.Index(msg, "\n"); i > 0 {
		msg = msg[:i]
	}
	msg = compiledURLs.ReplaceAllString(msg, "the schema")
	if len(msg) > 300 {
		msg = msg[:300]
	}
	return prefix + msg
}

// compiledURLs matches, quoted, a URL under the one a schema is compiled
// under (schemaURL's directory, legacySchemaURL), with anything after it
// (a fragment, a relative reference resolved against it).
var compiledURLs = regexp.MustCompile(`"(` + regexp.QuoteMeta(schemaURL[:strings.LastIndexByte(schemaURL, '/')+1]) +
	`|` + regexp.QuoteMeta(legacySchemaURL) + `)[^"]*"`)
