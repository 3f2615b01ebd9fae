package jobs

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/apierr"
)

// FuzzContractSchema: publishing any schema, and checking any document
// against one that was published, never panics and never answers an
// error (a 500 on enqueue, report, replay or test): a schema is published
// or refused with problems at its field, and a document is accepted or
// refused with at most maxValidationProblems problems inside its root.
// The depth, size and evaluation bounds keep each check short.
func FuzzContractSchema(f *testing.F) {
	schemas := []string{
		`true`, `false`, `{}`, `{"type":"object"}`, `null`, `[]`, `"x"`, `{"type":"strin"}`,
		`{"type":"object","required":["to","amount"],"additionalProperties":false,"properties":{
			"to":{"type":"string","format":"email","minLength":3,"maxLength":254},
			"amount":{"type":"integer","minimum":0,"maximum":1e18,"multipleOf":5},
			"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true,"maxItems":3}}}`,
		`{"$defs":{"node":{"type":"object","properties":{"next":{"$ref":"#/$defs/node"}}}},"$ref":"#/$defs/node"}`,
		`{"type":"object","$ref":"#"}`, `{"$ref":"other.json"}`, `{"$ref":"https://example.com/x.json"}`,
		`{"$id":"urn:x","$ref":"other.json"}`, `{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"type":"string"}],"additionalItems":false}`,
		`{"$schema":"http://json-schema.org/draft-04/schema#","properties":{"n":{"minimum":0,"exclusiveMinimum":true}}}`,
		`{"$schema":"https://example.com/meta.json"}`,
		`{"anyOf":[{"type":"string","pattern":"^[a-z]+$"},{"type":"number","multipleOf":0.01}],"not":{"const":"x"}}`,
		`{"oneOf":[{"properties":{"k":{"const":"a"}},"required":["k"]},{"properties":{"k":{"enum":["b",1,null]}}}]}`,
		`{"if":{"properties":{"t":{"const":"card"}}},"then":{"required":["pan"]},"else":{"required":["iban"]}}`,
		`{"dependentSchemas":{"a":{"required":["b"]}},"dependentRequired":{"c":["d"]},"propertyNames":{"maxLength":3}}`,
		`{"prefixItems":[{"type":"integer"},{"type":"string"}],"items":false,"contains":{"type":"integer"},"minContains":1}`,
		`{"unevaluatedProperties":false,"allOf":[{"properties":{"a":true}}],"patternProperties":{"^x-":{"type":"string"}}}`,
		`{"$dynamicAnchor":"meta","type":"object","properties":{"c":{"$dynamicRef":"#meta"}}}`,
		`{"$defs":{"a":{"$anchor":"A","type":"integer"}},"items":{"$ref":"#A"}}`,
		`{"type":"string","contentEncoding":"base64","contentMediaType":"application/json","contentSchema":{"type":"object"}}`,
		`{"pattern":"(?=x)"}`, `{"pattern":"\\p{L}+"}`, `{"minimum":1e-400,"maximum":1e308,"multipleOf":1e-300}`,
		`{"type":"number","multipleOf":0.0001,"exclusiveMaximum":9007199254740993}`,
		`{"format":"date-time"}`, `{"properties":{"$ref":{"type":"string"}}}`, `{"$id":"item.json","type":"integer"}`,
		`{"allOf":[{"allOf":[{"allOf":[{}]}]}],"anyOf":[true,false]}`, `{"enum":[]}`, `{"required":"a"}`,
	}
	docs := []string{`{}`, `{"to":"a@b.c","amount":10,"tags":["x"]}`, `{"to":1,"amount":-1,"tags":["x","x","y","z"],"extra":null}`,
		`{"next":{"next":{"next":1}}}`, `[1,"a",true]`, `["x",1]`, `"abc"`, `12.34`, `null`, `{"t":"card"}`,
		`{"a":1,"c":2,"x-y":3,"long":4}`, `"eyJhIjoxfQ=="`, `1e-1000001`, `9007199254740993`, `{"k":"a"}`,
		`{"$ref":"x"}`, `[[[[[]]]]]`, `{"n":0}`, `"2026-11-29T12:00:00Z"`, ``, `{`, `1e400`}
	for i, s := range schemas {
		f.Add([]byte(s), []byte(docs[i%len(docs)]))
		f.Add([]byte(s), []byte(docs[(i*7+3)%len(docs)]))
	}
	f.Fuzz(func(t *testing.T, schema, doc []byte) {
		var p apierr.Problems
		stored := checkSchema("inputSchema", schema, &p)
		if (stored == nil) == (len(p) == 0) {
			t.Fatalf("schema %q: stored %q, problems %v", schema, stored, p)
		}
		for _, e := range p {
			if (e.Field != "inputSchema" && !strings.HasPrefix(e.Field, "inputSchema.")) || e.Message == "" {
				t.Fatalf("schema %q refused with %#v", schema, e)
			}
		}
		if stored == nil {
			return
		}
		problems, err := validateDoc(stored, doc, "input")
		if err != nil {
			t.Fatalf("schema %s, document %q: %v", stored, doc, err)
		}
		if len(problems) > maxValidationProblems {
			t.Fatalf("schema %s, document %q: %d problems", stored, doc, len(problems))
		}
		quotable := docStrings(doc, stored)
		for _, e := range problems {
			if (e.Field != "input" && !strings.HasPrefix(e.Field, "input.")) || e.Message == "" {
				t.Fatalf("schema %s, document %q refused with %#v", stored, doc, e)
			}
			for _, s := range quotable {
				if strings.Contains(e.Message, s) {
					t.Fatalf("schema %s, document %q: message %q quotes the document's %q", stored, doc, e.Message, s)
				}
			}
		}
	})
}

// docStrings lists the strings of document doc (keys and values) that a
// problem's message must not quote: those of 6 bytes or more that neither
// the schema holds nor name a JSON type (as "(got number)" does).
func docStrings(doc, schema []byte) []string {
	var out []string
	dec := json.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		s, ok := tok.(string)
		switch {
		case !ok, len(s) < 6, bytes.Contains(schema, []byte(s)):
		case s == "string", s == "number", s == "object", s == "integer", s == "boolean":
		default:
			out = append(out, s)
		}
	}
}
