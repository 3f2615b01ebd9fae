package jobs

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

func TestValidateDocPointsIntoTheDocumentWithoutQuotingIt(t *testing.T) {
	t.Parallel()
	schema := []byte(`{"type":"object","required":["items","email"],"properties":{
		"email":{"type":"string","pattern":"^[^@]+@[^@]+$"},
		"items":{"type":"array","items":{"type":"object","required":["sku"],"properties":{"qty":{"type":"integer","minimum":1}}}}}}`)
	problems, err := validateDoc(schema, []byte(`{"email":"secret-value","items":[{"sku":"a","qty":1},{"qty":0}]}`), "input")
	require.NoError(t, err)
	require.Equal(t, []apierr.FieldError{
		{Field: "input.email", Message: `fails the schema's "pattern" rule`},
		{Field: "input.items.1.qty", Message: "must be at least 1"},
		{Field: "input.items.1.sku", Message: "is required"},
	}, problems)
	for _, p := range problems {
		require.NotContains(t, p.Message, "secret-value")
	}
	ok, err := validateDoc(schema, []byte(`{"email":"a@b","items":[]}`), "input")
	require.NoError(t, err)
	require.Nil(t, ok)
	// The cache answers the same compiled schema for the same bytes.
	a, err := schemas.get(schema)
	require.NoError(t, err)
	b, err := schemas.get(schema)
	require.NoError(t, err)
	require.Same(t, a, b)
}

// Problems are ordered by their place in the document, an array's items
// by index, so the ones kept under the cap are the first items'.
func TestValidateDocOrdersItemsByIndex(t *testing.T) {
	t.Parallel()
	schema := []byte(`{"type":"array","items":{"type":"integer"}}`)
	doc := `[` + strings.Repeat(`"x",`, 30) + `"x"]`
	problems, err := validateDoc(schema, []byte(doc), "input")
	require.NoError(t, err)
	require.Len(t, problems, maxValidationProblems)
	for i, p := range problems {
		require.Equal(t, "input."+strconv.Itoa(i), p.Field)
	}
	require.Positive(t, compareFields("input.b", "input.a.c"))
	require.Negative(t, compareFields("input.2", "input.name"))
	require.Zero(t, compareFields("input.a", "input.a"))
}

// A stored document the validator cannot read (an exponent big.Rat
// refuses: requests refuse it now, but an input stored before may be
// checked again by a replay) is a problem, not a panic (fuzzing: 500).
func TestValidateDocSurvivesAnUnreadableNumber(t *testing.T) {
	t.Parallel()
	problems, err := validateDoc([]byte(`{"properties":{"n":{"minimum":0}}}`), []byte(`{"n":1e-1000001}`), "input")
	require.NoError(t, err)
	require.Equal(t, []apierr.FieldError{{Field: "input", Message: "holds a number the schema check cannot read"}},
		problems)
}

// Every refusal names its rule: "not" has no keyword path of its own.
func TestValidateDocNamesTheNotRule(t *testing.T) {
	t.Parallel()
	problems, err := validateDoc([]byte(`{"properties":{"n":{"not":{"const":"x"}}}}`), []byte(`{"n":"x"}`), "input")
	require.NoError(t, err)
	require.Equal(t, []apierr.FieldError{{Field: "input.n", Message: `matches what the schema's "not" rule forbids`}},
		problems)
}

func TestCompileSchemaRefusesExternalReferences(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{`{"$ref":"file:///etc/hostname"}`, `{"$ref":"https://example.com/x.json"}`,
		`{"$schema":"https://example.com/meta.json"}`,
		// Relative references to another document (QA: they resolved to
		// the schema's own root, and every input was refused).
		`{"$ref":"other.json"}`, `{"properties":{"a":{"$ref":"foo/bar.json"}}}`, `{"$ref":"../x.json#/a"}`,
		`{"$ref":"schema.json"}`,
		// A root that applies itself to the same value validates nothing (review).
		`{"$id":"urn:foo","$ref":"other.json"}`, `{"$ref":"#"}`, `{"type":"object","$ref":"#"}`,
		`{"type":"object","allOf":[{"$ref":"#"}]}`, `{"type":["object","string"],"$ref":"#"}`,
		`{"allOf":[{"$ref":"#/$defs/a"}],"$defs":{"a":{"$ref":"#"}}}`,
		// Any loop that never moves to a child value (second review).
		`{"$dynamicAnchor":"r","$dynamicRef":"#r"}`,
		`{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"$recursiveRef":"#"}`,
		`{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`,
		`{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"properties":{"x":{"$ref":"#/$defs/a"}}}`,
		`{"if":true,"then":{"$ref":"#"}}`, `{"anyOf":[{"$ref":"#"}]}`, `{"oneOf":[{"$ref":"#"}]}`,
		`{"not":{"$ref":"#"}}`, `{"anyOf":[{"type":"string"},{"$ref":"#"}]}`} {
		err := publishableSchema([]byte(doc))
		require.Error(t, err, doc)
		require.NotContains(t, schemaCompileProblem(err), "ratchet.invalid", doc)
	}
	// A reference to another document is refused without repeating it
	// (security QA: the URL came back twice).
	for _, ref := range []string{"file:///etc/hostname", "https://example.com/x.json", "other.json", "../x.json#/a"} {
		err := publishableSchema([]byte(`{"properties":{"a":{"$ref":"` + ref + `"}}}`))
		require.Error(t, err, ref)
		problem := schemaCompileProblem(err)
		require.Contains(t, problem, "external references are not allowed", ref)
		require.NotContains(t, problem, strings.Split(strings.TrimPrefix(ref, "../"), "#")[0], ref)
	}
	for _, doc := range []string{`true`, `{}`, `{"$defs":{"a":{"type":"string"}},"$ref":"#/$defs/a"}`,
		`{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}`,
		`{"$defs":{"item":{"$id":"item.json","type":"string"}},"properties":{"a":{"$ref":"item.json"}}}`,
		`{"type":"object","properties":{"child":{"$ref":"#"}}}`,
		// Recursion into child values is ordinary.
		`{"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"n":{"type":"object","properties":{"next":{"$ref":"#/definitions/n"}}}},"$ref":"#/definitions/n"}`,
		`{"type":"array","items":{"anyOf":[{"type":"string"},{"$ref":"#"}]}}`,
		`{"$dynamicAnchor":"node","type":"object","properties":{"kids":{"type":"array","items":{"$dynamicRef":"#node"}}}}`,
		`{"$defs":{"s":{"type":"string"}},"anyOf":[{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"}]}`,
		`false`} {
		err := publishableSchema([]byte(doc))
		require.NoError(t, err, doc)
	}

	// An embedded resource's relative $id is where its $ref resolves.
	problems, err := validateDoc([]byte(`{"$defs":{"item":{"$id":"item.json","type":"string"}},"properties":{"a":{"$ref":"item.json"}}}`),
		[]byte(`{"a":5}`), "input")
	require.NoError(t, err)
	require.Len(t, problems, 1)
	require.Equal(t, "input.a", problems[0].Field)
}

// A schema published before relative references were refused keeps the
// meaning it was published with (contracts are immutable): it compiles as
// it did then, rather than failing every enqueue as stored schemas that
// "do not compile".
// A $schema naming no dialect the compiler reads is refused for what it is,
// without repeating the URL (QA: it read as a $ref to another document in a
// schema with none); a $ref to another document still reads as one.
func TestCompileSchemaSaysWhenItsDialectIsNotSupported(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{`{"$schema":"http://example.com/x","type":"object"}`,
		`{"$schema":"http://example.com/x#","type":"object"}`,
		`{"properties":{"a":{"$schema":"https://example.com/meta.json"}}}`,
		`{"$schema":"` + schemaURL + `"}`, // the document's own URL: the compiler's refusal
		`{"$schema":"https://example.com/meta.json","$ref":"https://example.com/other.json"}`} {
		err := publishableSchema([]byte(doc))
		require.Error(t, err, doc)
		problem := schemaCompileProblem(err)
		require.Contains(t, problem, "its $schema names a dialect this service does not support", doc)
		require.Contains(t, problem, `JSON Schema 2020-12 ("https://json-schema.org/draft/2020-12/schema"`, doc)
		require.NotContains(t, problem, "$ref", doc)
		require.NotContains(t, problem, "example.com", doc)
		require.NotContains(t, problem, "ratchet.invalid", doc)
	}
	problem := schemaCompileProblem(publishableSchema([]byte(
		`{"$schema":"https://json-schema.org/draft/2020-12/schema","$ref":"https://example.com/other.json"}`)))
	require.Contains(t, problem, "it has a $ref to another document", "a supported dialect's external $ref")
}

func TestStoredSchemaWithARelativeReferenceKeepsItsMeaning(t *testing.T) {
	t.Parallel()
	problems, err := validateDoc([]byte(`{"type":"object","properties":{"a":{"$ref":"foo/bar.json"}}}`),
		[]byte(`{"a":{}}`), "input")
	require.NoError(t, err)
	require.Empty(t, problems, "a is checked against the root, as before")
}

// A document checked against a recursive schema nests at most
// MaxCheckedDepth levels: one more is refused at its root, unchecked.
func TestValidateDocRefusesADocumentTooDeepToCheck(t *testing.T) {
	t.Parallel()
	schema := []byte(`{"$defs":{"n":{"type":"object","properties":{"a":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`)
	require.NoError(t, publishableSchema(schema))
	nested := func(levels int, leaf string) []byte {
		return []byte(strings.Repeat(`{"a":`, levels-1) + leaf + strings.Repeat(`}`, levels-1))
	}
	problems, err := validateDoc(schema, nested(MaxCheckedDepth, `{}`), "input")
	require.NoError(t, err)
	require.Nil(t, problems)
	problems, err = validateDoc(schema, nested(MaxCheckedDepth-1, `{"a":5}`), "input")
	require.NoError(t, err)
	require.Len(t, problems, 1, "a refusal at the bound is the schema's")
	require.NotContains(t, problems[0].Message, "too deep")
	problems, err = validateDoc(schema, nested(MaxCheckedDepth+1, `{}`), "output")
	require.NoError(t, err)
	require.Equal(t, []apierr.FieldError{{Field: "output",
		Message: "nests objects and arrays more than 1000 levels deep, too deep to check against the contract's schema"}}, problems)
	// Brackets inside strings are not levels.
	require.False(t, nestsDeeperThan([]byte(`{"s":"[[[[{{{{\\\"[["}`), 1))
	require.True(t, nestsDeeperThan([]byte(`{"s":"\\"}[[`), 1))
}

// checkEvaluations counts each subschema once per value it reaches, with
// the child keywords followed to the children they apply to.
func TestCheckEvaluationsFollowsEachKeywordToItsValues(t *testing.T) {
	t.Parallel()
	count := func(schema, doc string) int64 {
		t.Helper()
		s, err := compileSchema([]byte(schema))
		require.NoError(t, err)
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
		require.NoError(t, err)
		return checkEvaluations(s, v, 1_000)
	}
	// The root, a by name, z by pattern, and the rest by additionalProperties.
	obj := `{"properties":{"a":{"type":"string"}},"patternProperties":{"^z":{}},"additionalProperties":{"type":"integer"}}`
	require.Equal(t, int64(1+1+1+2), count(obj, `{"a":"x","zz":1,"m":2,"n":3}`))
	// prefixItems by index, items for the rest, contains for each.
	arr := `{"prefixItems":[{},{}],"items":{"type":"integer"},"contains":{"minimum":1}}`
	require.Equal(t, int64(1+2+3+5), count(arr, `[1,2,3,4,5]`))
	// Every branch of an anyOf is counted, for each value it meets.
	require.Equal(t, int64(1+3*(1+3)), count(`{"items":{"anyOf":[{},{},{}]}}`, `[1,2,3]`))
	// Earlier drafts: items as a list, then additionalItems.
	require.Equal(t, int64(1+3), count(`{"$schema":"http://json-schema.org/draft-07/schema#","items":[{}],"additionalItems":{}}`,
		`[1,2,3]`))
	// It stops once past its bound.
	s, err := compileSchema([]byte(`{"items":{}}`))
	require.NoError(t, err)
	require.Equal(t, int64(11), checkEvaluations(s, make([]any, 100), 10))
}

// A small document that would evaluate too many subschemas is refused
// unchecked, at once (review: 20 000 values each failing an anyOf of 4 990
// branches ran for minutes and tens of GiB); what fits is checked.
func TestValidateDocRefusesADocumentTooCostlyToCheck(t *testing.T) {
	t.Parallel()
	branches := make([]string, 4_990)
	for i := range branches {
		branches[i] = `{"type":"string","minLength":` + strconv.Itoa(i) + `}`
	}
	schema := []byte(`{"type":"array","items":{"anyOf":[` + strings.Join(branches, ",") + `]}}`)
	require.NoError(t, publishableSchema(schema))
	values := func(n int, v string) []byte {
		return []byte("[" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "]")
	}
	problems, err := validateDoc(schema, values(20_000, "{}"), "input")
	require.NoError(t, err)
	require.Equal(t, []apierr.FieldError{{Field: "input", Message: "is too large to check against the contract's " +
		"schema: checking it could evaluate more than 1500000 subschemas (send fewer values, or publish a schema " +
		"with fewer alternatives per value)"}}, problems)
	problems, err = validateDoc(schema, values(20, `"x"`), "output")
	require.NoError(t, err)
	require.Nil(t, problems)
	problems, err = validateDoc(schema, values(20, "{}"), "output")
	require.NoError(t, err)
	require.NotEmpty(t, problems)
	require.NotContains(t, problems[0].Message, "too large", "checked, and refused by the schema")
}

// A keyword whose work grows with what it lists or the value it reads is
// counted at its cost, not as one evaluation: each of these documents (a
// request may carry it) took from 8 s to minutes of CPU, past the request's
// deadline, and is refused unchecked, at once; a small one is checked
// (QA, writing the contract-schema fuzz target).
func TestValidateDocCountsTheWorkOfCostlyKeywords(t *testing.T) {
	t.Parallel()
	list := func(n int, item func(i int) string) string {
		items := make([]string, n)
		for i := range items {
			items[i] = item(i)
		}
		return strings.Join(items, ",")
	}
	const draft07 = `"$schema":"http://json-schema.org/draft-07/schema#",`
	numbers := list(20_000, strconv.Itoa)
	long := strings.Repeat("a", 1<<20-64)
	cases := []struct {
		name, schema, costly, small string
	}{
		{"a pattern's program times the text", `{"type":"string","pattern":"(a|aa){1000}b"}`,
			`"` + long + `"`, `"aaab"`},
		{"an enum of numbers, each parsed", `{"items":{"enum":[` + numbers + `]}}`,
			"[" + list(2_000, func(int) string { return "0" }) + "]", "[0,1,2]"},
		{"patternProperties, each tested", `{"patternProperties":{` +
			list(4_000, func(i int) string { return `"^a` + strconv.Itoa(i) + `$":true` }) + `}}`,
			"{" + list(10_000, func(i int) string { return `"k` + strconv.Itoa(i) + `":0` }) + "}", `{"a1":0,"k":1}`},
		{"required names, each looked up", `{"items":{"required":[` +
			list(30_000, func(i int) string { return `"` + strconv.Itoa(i) + `"` }) + `]}}`,
			"[" + list(100_000, func(int) string { return "{}" }) + "]", "[{}]"},
		{"a const array, compared whole", `{"$defs":{"c":{"const":[` + list(4_000, strconv.Itoa) + `]}},"items":{"anyOf":[` +
			list(50, func(int) string { return `{"$ref":"#/$defs/c"}` }) + `]}}`,
			"[" + list(40, func(int) string { return "[" + list(4_000, strconv.Itoa) + "]" }) + "]", "[[1]]"},
		{"uniqueItems, each item hashed", `{"anyOf":[` +
			list(2_000, func(int) string { return `{"uniqueItems":true,"minItems":1000000}` }) + `]}`,
			"[" + list(100_000, strconv.Itoa) + "]", "[1,2]"},
		{"a format read as a regular expression", `{` + draft07 + `"items":{"anyOf":[` +
			list(100, func(int) string { return `{"format":"regex"}` }) + `]}}`,
			`["` + strings.Repeat("(a", 1<<18) + `"]`, `["a+"]`},
		{"a long number parsed by each bound", `{"items":{"anyOf":[` +
			list(1_000, func(i int) string { return `{"minimum":` + strconv.Itoa(i) + `}` }) + `]}}`,
			"[" + list(1_000, func(int) string { return "-1." + strings.Repeat("3", 990) }) + "]", "[-1.5]"},
	}
	tooLarge := "is too large to check against the contract's schema: checking it could evaluate more than 1500000 " +
		"subschemas (send fewer values, or publish a schema with fewer alternatives per value)"
	for _, c := range cases {
		var p apierr.Problems
		schema := checkSchema("inputSchema", json.RawMessage(c.schema), &p)
		require.Empty(t, p, c.name)
		require.LessOrEqual(t, len(c.costly), 1<<20, c.name)
		problems, err := validateDoc(schema, []byte(c.costly), "input")
		require.NoError(t, err, c.name)
		require.Equal(t, []apierr.FieldError{{Field: "input", Message: tooLarge}}, problems, c.name)
		problems, err = validateDoc(schema, []byte(c.small), "input")
		require.NoError(t, err, c.name)
		for _, pr := range problems {
			require.NotEqual(t, tooLarge, pr.Message, c.name)
		}
	}
}

// A schema that breaks its dialect's rules is told where and which rule,
// as an input is (QA: all of these were told one line naming neither),
// without quoting the offending value.
func TestPublicationSaysWhereASchemaBreaksItsDialect(t *testing.T) {
	t.Parallel()
	const prefix = "is not valid JSON Schema (2020-12, or the draft its $schema names): "
	const typeNames = `must be one of "array", "boolean", "integer", "null", "number", "object", "string"`
	cases := []struct {
		doc  string
		want []apierr.FieldError
	}{
		{`{"type":"object","required":"a"}`, []apierr.FieldError{
			{Field: "inputSchema.required", Message: prefix + "must be of type array (got string)"}}},
		{`{"properties":{"a":{"minLength":-1},"b":{"type":"strin"}}}`, []apierr.FieldError{
			{Field: "inputSchema.properties.a.minLength", Message: prefix + "must be at least 0"},
			{Field: "inputSchema.properties.b.type", Message: prefix + typeNames}}},
		// One problem each (QA: each was told once per alternative of the
		// meta-schema's "type", a name or an array of names).
		{`{"type":"nope"}`, []apierr.FieldError{{Field: "inputSchema.type", Message: prefix + typeNames}}},
		{`{"type":["string","nope"]}`, []apierr.FieldError{{Field: "inputSchema.type.1", Message: prefix + typeNames}}},
		{`{"type":1}`, []apierr.FieldError{{Field: "inputSchema.type", Message: prefix +
			"must be of type array (got number), or be one of " + strings.TrimPrefix(typeNames, "must be one of ")}}},
		{`{"properties":{"password":{"type":"string","pattern":"^(?=.*[A-Z]).{8,}$"}}}`, []apierr.FieldError{
			{Field: "inputSchema.properties.password.pattern", Message: prefix +
				"must be a valid regex (RE2 syntax, as Go's regexp reads it: no lookaround or backreferences)"}}},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","properties":{"n":{"minimum":"1"}}}`, []apierr.FieldError{
			{Field: "inputSchema.properties.n.minimum", Message: prefix + "must be of type number (got string)"}}},
	}
	for _, c := range cases {
		var p apierr.Problems
		require.Nil(t, checkSchema("inputSchema", []byte(c.doc), &p), c.doc)
		require.Equal(t, apierr.Problems(c.want), p, c.doc)
		for _, pr := range p {
			require.NotContains(t, pr.Message, "(?=", "the value is not quoted")
		}
	}
	// Other refusals keep their one problem on the field.
	var p apierr.Problems
	require.Nil(t, checkSchema("outputSchema", []byte(`{"$ref":"#/$defs/missing"}`), &p))
	require.Len(t, p, 1)
	require.Equal(t, "outputSchema", p[0].Field)
}

// A reference the schema does not hold is told so, without the URL the
// schema is compiled under (QA: {"$ref":"#/nonexist"} was told
// `json-pointer in "schema#/nonexist" not found`, what remained of
// schemaURL), nor the reference.
func TestAReferenceToAMissingPartIsToldPlainly(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{`{"$ref":"#/nonexist"}`, `{"$ref":"#/$defs/a/b"}`, `{"$ref":"#nowhere"}`,
		`{"$defs":{"a":{"$id":"x"},"b":{"$id":"x"}}}`} {
		var p apierr.Problems
		require.Nil(t, checkSchema("inputSchema", []byte(doc), &p), doc)
		require.Len(t, p, 1, doc)
		require.Equal(t, "inputSchema", p[0].Field)
		for _, leak := range []string{"schema#", "contract-schema", "ratchet.invalid", "json-pointer", "nonexist",
			"nowhere", "urn:"} {
			require.NotContains(t, p[0].Message, leak, doc)
		}
		require.True(t, strings.HasPrefix(p[0].Message, "must be a valid JSON Schema"), p[0].Message)
	}
}

// A value that fails every alternative of an anyOf (or a oneOf none
// matches) is told one problem when the alternatives are all about the
// value itself, the types they want as one; alternatives for another kind
// of value than it are left out when some are for its kind. The enqueue,
// the report and the replay preview all tell it so (validateDoc).
func TestAValueFailingEveryAlternativeIsToldOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		schema, doc string
		want        []apierr.FieldError
	}{
		{`{"anyOf":[{"type":"integer"},{"type":"boolean"}]}`, `"secret"`,
			[]apierr.FieldError{{Field: "input", Message: "must be of type integer or boolean (got string)"}}},
		{`{"properties":{"a":{"oneOf":[{"type":"integer"},{"type":"null"}]}}}`, `{"a":"secret"}`,
			[]apierr.FieldError{{Field: "input.a", Message: "must be of type integer or null (got string)"}}},
		{`{"anyOf":[{"type":"integer"},{"type":"string","minLength":10}]}`, `"secret"`,
			[]apierr.FieldError{{Field: "input", Message: "must be at least 10 characters"}}},
		{`{"anyOf":[{"type":"integer","minimum":5},{"type":"string","maxLength":1}]}`, `2`,
			[]apierr.FieldError{{Field: "input", Message: "must be at least 5"}}},
		{`{"anyOf":[{"minimum":5},{"multipleOf":7}]}`, `2`, []apierr.FieldError{{Field: "input",
			Message: `matches none of the alternatives of the schema's "anyOf" rule: it must be at least 5; ` +
				`it fails the schema's "multipleOf" rule`}}},
		{`{"anyOf":[{"type":"string"},{"type":"array","items":{"type":"string"}}]}`, `[1,"a",2]`,
			[]apierr.FieldError{{Field: "input.0", Message: "must be of type string (got number)"},
				{Field: "input.2", Message: "must be of type string (got number)"}}},
		// Alternatives about the value's members stay as they were.
		{`{"anyOf":[{"required":["a"]},{"required":["b"]}]}`, `{}`,
			[]apierr.FieldError{{Field: "input.a", Message: "is required"}, {Field: "input.b", Message: "is required"}}},
	} {
		problems, err := validateDoc([]byte(c.schema), []byte(c.doc), "input")
		require.NoError(t, err, c.schema)
		require.Equal(t, c.want, problems, c.schema)
	}
}

// Under draft-07 and earlier, formats are assertions: a refusal names the
// format, never the value.
func TestValidateDocNamesAnAssertedFormat(t *testing.T) {
	t.Parallel()
	problems, err := validateDoc([]byte(`{"$schema":"http://json-schema.org/draft-07/schema#",
		"properties":{"email":{"format":"email"}}}`), []byte(`{"email":"secret-value"}`), "input")
	require.NoError(t, err)
	require.Equal(t, []apierr.FieldError{{Field: "input.email", Message: "must be a valid email"}}, problems)
	// Under 2020-12 a format is an annotation.
	problems, err = validateDoc([]byte(`{"properties":{"email":{"format":"email"}}}`), []byte(`{"email":"secret-value"}`), "input")
	require.NoError(t, err)
	require.Nil(t, problems)
}
