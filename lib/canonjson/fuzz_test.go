package canonjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/getratchet/ratchet/lib/jsonstrict"
)

// FuzzMarshal: whatever the document, Marshal neither panics nor answers
// invalid JSON; what it answers is canonical (canonicalising it again, as
// raw JSON or as Canonical, changes nothing), holds the document's value,
// and hashes as the document does inside a []any. A document a request
// body may carry (jsonstrict takes it) canonicalises as every other
// spelling of its value does: keys in another order, other white space,
// strings escaped otherwise, numbers spelled otherwise (seed picks the
// spelling).
func FuzzMarshal(f *testing.F) {
	for _, s := range []string{
		`null`, `true`, `"x"`, `0`, `-0`, `1.0`, `1e3`, `1E+3`, `-2.5e-7`, `0.1`, `0.10000000000000001`,
		`9007199254740993`, `9007199254740993.0`, `9.007199254740993e15`, `12345678901234567`,
		`1234567890123456789`, `1234567890123456789.0`, `18446744073709551615`, `9223372036854775808`,
		`1e21`, `1e-400`, `1e400`, `5e-324`, `1.7976931348623157e308`, `100000000000000000000`,
		`0.10000000000000000001`, `1.00000000000000000001e-100000`, `1e-9223372036854775800`,
		`[]`, `{}`, `[1,2,[3,{"b":1,"a":2}]]`,
		`{"b": [3, 1, {"z":1,"a":2}], "a": "x", "n": 1.50}`,
		`{"html": "<a href=\"x\">&</a>", "u": "\u00e9\u2028", "e": "\ud83d\ude00", "s": "a\/b\\c\n"}`,
		`{"to":"alice@example.com","amount_micros":1250000,"items":[{"sku":"a","qty":1.0}],"meta":null}`,
		`{"a":1,"a":2}`, `{"":0,"\u0000":1}`, "{\"\xff\":\"\xfe\"}", `{"\ud800":"x"}`, `{"a":` + "\u2028" + `1}`,
		`[1] [2]`, `{"a":`, `{"a":1e999,"b":-1E-999}`, `{"n":123456789012345678901234567890e-5}`,
	} {
		f.Add([]byte(s), uint64(len(s)))
	}
	f.Fuzz(func(t *testing.T, doc []byte, seed uint64) {
		canon, err := Marshal(json.RawMessage(doc))
		if err != nil {
			if json.Valid(doc) {
				t.Fatalf("%q is JSON, Marshal refused it: %v", doc, err)
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("%q is not JSON, Marshal answered %s", doc, canon)
		}
		if !json.Valid(canon) || !utf8.Valid(canon) {
			t.Fatalf("%q canonicalises as %q, not JSON", doc, canon)
		}
		again, err := Marshal(json.RawMessage(canon))
		if err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("%q canonicalises as %s, which canonicalises as %s (%v)", doc, canon, again, err)
		}
		if same, _ := Marshal(Canonical(canon)); !bytes.Equal(same, canon) {
			t.Fatalf("Canonical(%s) marshals as %s", canon, same)
		}
		h1, err1 := Hash([]any{"run", json.RawMessage(doc), 7})
		h2, err2 := Hash([]any{"run", Canonical(canon), 7})
		if err1 != nil || err2 != nil || h1 != h2 {
			t.Fatalf("%q hashes as %s raw, %s canonical (%v, %v)", doc, h1, h2, err1, err2)
		}
		if msg := sameValue(tree(t, doc), tree(t, canon)); msg != "" {
			t.Fatalf("%q canonicalises as %s: %s", doc, canon, msg)
		}
		if !requestBody(doc) {
			return
		}
		rng := rand.New(rand.NewSource(int64(seed)))
		for range 3 {
			var b bytes.Buffer
			respell(&b, tree(t, doc), rng)
			if !requestBody(b.Bytes()) {
				continue // a spelling a request may not carry: an exponent beyond ±999, say
			}
			other, err := Marshal(json.RawMessage(b.Bytes()))
			if err != nil {
				t.Fatalf("%q respelled as %q: %v", doc, b.Bytes(), err)
			}
			if !bytes.Equal(other, canon) {
				t.Fatalf("%q canonicalises as %s; its respelling %q as %s", doc, canon, b.Bytes(), other)
			}
		}
	})
}

// requestBody reports whether doc is a value a request body may carry
// (jsonstrict: no repeated key, NUL, lone surrogate or bad UTF-8, no
// number beyond a float64 or with an exponent beyond ±999).
func requestBody(doc []byte) bool {
	var v struct {
		V json.RawMessage `json:"v"`
	}
	body := append(append([]byte(`{"v":`), doc...), '}')
	return jsonstrict.Decode(body, &v) == nil
}

// member is one key of an object, in document order.
type member struct {
	key string
	val any
}

// tree reads a JSON document keeping what a respelling needs: object
// members in order (repeats too), numbers as written.
func tree(t *testing.T, doc []byte) any {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var read func() any
	read = func() any {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		switch d := tok.(type) {
		case json.Delim:
			if d == '[' {
				arr := []any{}
				for dec.More() {
					arr = append(arr, read())
				}
				_, _ = dec.Token()
				return arr
			}
			obj := []member{}
			for dec.More() {
				k, _ := dec.Token()
				obj = append(obj, member{k.(string), read()})
			}
			_, _ = dec.Token()
			return obj
		}
		return tok
	}
	return read()
}

// sameValue says how canonical tree c differs in value from document tree
// d ("" when it does not): the same members (the last of repeated keys),
// strings and array order, and each number the same, exactly or as a
// float64.
func sameValue(d, c any) string {
	switch d := d.(type) {
	case []member:
		cm, ok := c.([]member)
		if !ok {
			return fmt.Sprintf("object became %T", c)
		}
		last := map[string]any{}
		for _, m := range d {
			last[m.key] = m.val
		}
		if len(last) != len(cm) {
			return fmt.Sprintf("%d keys became %d", len(last), len(cm))
		}
		for i, m := range cm {
			if i > 0 && cm[i-1].key >= m.key {
				return fmt.Sprintf("keys %q, %q out of order", cm[i-1].key, m.key)
			}
			dv, ok := last[m.key]
			if !ok {
				return fmt.Sprintf("key %q appeared", m.key)
			}
			if msg := sameValue(dv, m.val); msg != "" {
				return m.key + ": " + msg
			}
		}
	case []any:
		ca, ok := c.([]any)
		if !ok || len(ca) != len(d) {
			return fmt.Sprintf("array of %d became %v", len(d), c)
		}
		for i := range d {
			if msg := sameValue(d[i], ca[i]); msg != "" {
				return strconv.Itoa(i) + ": " + msg
			}
		}
	case json.Number:
		cn, ok := c.(json.Number)
		if !ok || !sameNumber(d, cn) {
			return fmt.Sprintf("number %s became %v", d, c)
		}
	default:
		if d != c {
			return fmt.Sprintf("%#v became %#v", d, c)
		}
	}
	return ""
}

func sameNumber(a, b json.Number) bool {
	if a == b {
		return true
	}
	negA, digitsA, expA, okA := exactValue(string(a))
	negB, digitsB, expB, okB := exactValue(string(b))
	if okA && okB && negA == negB && digitsA == digitsB && expA == expB {
		return true
	}
	fa, errA := a.Float64()
	fb, errB := b.Float64()
	return errA == nil && errB == nil && fa == fb
}

// exactValue reads JSON number lit as digits × 10^exp: no leading or
// trailing zeros in digits ("0" for zero, which is never negative); false
// for an exponent beyond ±2^50.
func exactValue(lit string) (neg bool, digits string, exp int, ok bool) {
	rest, neg := strings.CutPrefix(lit, "-")
	mant, expText, hasExp := strings.Cut(strings.ToLower(rest), "e")
	if hasExp {
		var err error
		if exp, err = strconv.Atoi(expText); err != nil || exp > 1<<50 || exp < -1<<50 {
			return false, "", 0, false
		}
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits = strings.TrimLeft(whole+frac, "0")
	exp -= len(frac)
	if trimmed := strings.TrimRight(digits, "0"); trimmed != digits {
		exp += len(digits) - len(trimmed)
		digits = trimmed
	}
	if digits == "" {
		return false, "0", 0, true
	}
	return neg, digits, exp, true
}

// respell writes tree v as other JSON text of the same value.
func respell(b *bytes.Buffer, v any, rng *rand.Rand) {
	space(b, rng)
	switch v := v.(type) {
	case []member:
		ms := slices.Clone(v)
		rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		b.WriteByte('{')
		for i, m := range ms {
			if i > 0 {
				b.WriteByte(',')
			}
			space(b, rng)
			respellString(b, m.key, rng)
			space(b, rng)
			b.WriteByte(':')
			respell(b, m.val, rng)
		}
		space(b, rng)
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			respell(b, e, rng)
		}
		space(b, rng)
		b.WriteByte(']')
	case string:
		respellString(b, v, rng)
	case json.Number:
		b.WriteString(respellNumber(string(v), rng))
	default:
		raw, _ := json.Marshal(v)
		b.Write(raw)
	}
	space(b, rng)
}

func space(b *bytes.Buffer, rng *rand.Rand) {
	for range rng.Intn(3) {
		b.WriteByte(" \t\n\r"[rng.Intn(4)])
	}
}

// respellString writes s as a JSON string, each character as itself or
// escaped (a character beyond the Basic Multilingual Plane as a surrogate
// pair).
func respellString(b *bytes.Buffer, s string, rng *rand.Rand) {
	b.WriteByte('"')
	for _, r := range s {
		escape := rng.Intn(3) == 0
		switch {
		case r == '"' || r == '\\' || r < 0x20 || escape:
			if short, ok := map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`,
				'\n': `\n`, '\r': `\r`, '\t': `\t`}[r]; ok && rng.Intn(2) == 0 {
				b.WriteString(short)
			} else if r > 0xffff {
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04X`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			} else {
				fmt.Fprintf(b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// respellNumber writes JSON number lit another way with its exact value:
// its digits with more zeros, the point elsewhere, another exponent. One
// class of values keeps its form, integer literal or not: an integer
// within int64 of up to 17 significant digits whose float64 reading is
// written as another integer. A spelling of it with a fraction or an
// exponent is read as its float64 by design, as stored fingerprints and
// keys were made, and an integer literal as itself (normalizeNumber).
func respellNumber(lit string, rng *rand.Rand) string {
	neg, digits, exp, ok := exactValue(lit)
	if !ok {
		return lit
	}
	if digits == "0" {
		neg = rng.Intn(2) == 0 // -0 is 0
	}
	sign := ""
	if neg {
		sign = "-"
	}
	integer := !strings.ContainsAny(lit, ".eE")
	keepForm := len(digits) <= 17 && !floatReadsAsItself(sign+digits, exp)
	extra := rng.Intn(4)
	digits += strings.Repeat("0", extra)
	exp -= extra
	var out string
	switch form := rng.Intn(4); {
	case keepForm && !integer:
		out = digits + "e" + strconv.Itoa(exp)
	case (keepForm && integer) || (form == 0 && exp >= 0 && exp < 40):
		if exp < 0 { // the zeros just added
			digits, exp = digits[:len(digits)+exp], 0
		}
		out = digits + strings.Repeat("0", exp)
	case form == 1 && exp < 0 && -exp < 60:
		// A point inside (or before) the digits.
		p := len(digits) + exp
		if p > 0 {
			out = digits[:p] + "." + digits[p:]
		} else {
			out = "0." + strings.Repeat("0", -p) + digits
		}
	case form == 2:
		// One digit before the point.
		e := exp + len(digits) - 1
		out = digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		out += []string{"e", "E", "e+", "E+", "e0"}[rng.Intn(5)] + strconv.Itoa(e)
		if e < 0 {
			out = strings.Replace(strings.Replace(out, "+", "", 1), "0-", "-0", 1)
		}
	default:
		out = digits + "e" + strconv.Itoa(exp)
	}
	return sign + out
}

// floatReadsAsItself reports whether the integer digits × 10^exp, when
// it is one within int64, is written as itself when read as a float64:
// below 10^18 its float64 is exactly it, beyond its float64's shortest
// form is (true for any other number, where the question does not arise).
func floatReadsAsItself(digits string, exp int) bool {
	if exp < 0 || exp > 19 {
		return true
	}
	n, ok := new(big.Int).SetString(digits+strings.Repeat("0", exp), 10)
	if !ok || !n.IsInt64() {
		return true
	}
	f, _ := new(big.Float).SetInt(n).Float64()
	if f < 1e18 && f > -1e18 {
		back, _ := big.NewFloat(f).Int(nil)
		return back.Cmp(n) == 0
	}
	return strconv.FormatFloat(f, 'f', -1, 64) == n.String()
}

// FuzzWriteString: writeString writes what encoding/json writes for any
// string.
func FuzzWriteString(f *testing.F) {
	for _, s := range []string{"", "plain", "<a href='x'>&</a>", "a\u2028b\u2029c", "\xff\xfe", "\x00\x1f\x7f", `"\`,
		"é😀", "\xed\xa0\x80", "\xe2\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var buf bytes.Buffer
		writeString(&buf, s)
		if want, _ := json.Marshal(s); !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("%q: %s, encoding/json %s", s, buf.Bytes(), want)
		}
	})
}
