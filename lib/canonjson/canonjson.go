// Package canonjson produces canonical JSON: object keys sorted, array order
// kept, no insignificant white space, numbers in their shortest exact form.
// Fingerprints and generated idempotency keys hash it, so equivalent requests
// agree whatever order their producer wrote the keys in.
package canonjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Canonical is JSON already in canonical form: a result of Marshal. Inside
// a value given to Marshal or Hash (as the value itself or an element of a
// []any) it is copied as it is rather than parsed again: canonical JSON is
// its own canonical form, so the bytes are the same, and an input
// canonicalised once is not re-parsed for every hash that includes it.
// Bytes that are not a Marshal result must not be converted to Canonical.
type Canonical []byte

// Marshal returns the canonical encoding of v (any JSON-marshalable value,
// including json.RawMessage and Canonical).
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := encode(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// encode writes the canonical encoding of v: a Canonical as it is, a []any
// element by element, a valid string, a bool, an integer (or a pointer to a
// string or an integer) or nil directly, anything else
// through encoding/json and back (so that object keys come out sorted and
// numbers normalised).
func encode(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case Canonical:
		buf.Write(t)
		return nil
	case nil, bool:
		return write(buf, t)
	case string:
		// encoding/json gives a valid string back unchanged (an invalid one
		// comes back with U+FFFD in place of its bad bytes).
		if utf8.ValidString(t) {
			return write(buf, t)
		}
	case *string:
		if t == nil {
			return write(buf, nil)
		}
		return encode(buf, *t)
	case int:
		buf.WriteString(strconv.Itoa(t))
		return nil
	case int32:
		buf.WriteString(strconv.FormatInt(int64(t), 10))
		return nil
	case int64:
		buf.WriteString(strconv.FormatInt(t, 10))
		return nil
	case *int, *int32, *int64:
		// An operation's optional numbers (a timeout, a contract version).
		return encode(buf, derefInt(t))
	case []any:
		return writeArray(buf, t, encode)
	}
	raw, ok := v.(json.RawMessage)
	if !ok || raw == nil || !json.Valid(raw) {
		// A RawMessage that is valid JSON is read as it is: encoding/json
		// would copy it only to compact it, and the tree read back is the
		// same. Anything else, and the refusal of one that is not JSON,
		// goes through encoding/json as it always did.
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return fmt.Errorf("canonjson: %w", err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return fmt.Errorf("canonjson: %w", err)
	}
	return write(buf, tree)
}

// derefInt is the integer p points to, or nil for a nil pointer.
func derefInt(p any) any {
	switch t := p.(type) {
	case *int:
		if t != nil {
			return *t
		}
	case *int32:
		if t != nil {
			return *t
		}
	case *int64:
		if t != nil {
			return *t
		}
	}
	return nil
}

func write(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(t))
	case string:
		writeString(buf, t)
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if err := write(buf, t[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		return writeArray(buf, t, write)
	case json.Number:
		buf.WriteString(normalizeNumber(t))
	default:
		b, err := json.Marshal(t)
		if err != nil {
			return fmt.Errorf("canonjson: %w", err)
		}
		buf.Write(b)
	}
	return nil
}

// writeString writes s as encoding/json does (HTML characters, U+2028 and
// U+2029 escaped, invalid UTF-8 as U+FFFD): quoted as it is when it holds
// nothing encoding/json would change, as nearly every id, name and key
// does, else through encoding/json.
func writeString(buf *bytes.Buffer, s string) {
	if !plainString(s) {
		b, _ := json.Marshal(s)
		buf.Write(b)
		return
	}
	buf.WriteByte('"')
	buf.WriteString(s)
	buf.WriteByte('"')
}

// plainString says whether encoding/json writes s between quotes unchanged:
// valid UTF-8 without control characters, '"', '\\', '<', '>', '&', U+2028
// or U+2029.
func plainString(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += size
	}
	return true
}

// writeArray writes elems as a JSON array, each element with elem.
func writeArray(buf *bytes.Buffer, elems []any, elem func(*bytes.Buffer, any) error) error {
	buf.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := elem(buf, e); err != nil {
			return err
		}
	}
	buf.WriteByte(']')
	return nil
}

// normalizeNumber writes a number so that spellings of one value hash
// alike: an integer literal within int64 exactly; any other literal of at
// most 17 significant digits as its float64 in Go's shortest form, so 1.0,
// 1e3 and 1000 hash alike (JavaScript's rule), and so do
// 0.10000000000000001 (how some encoders print 0.1) and 0.1 — these keep
// the encoding stored fingerprints and keys were made with. A longer
// literal carries more than a float64 holds: an integer within int64 is
// written as that integer, and any other as its exact value (decimal)
// unless it spells its float64 exactly (holds). Collapsed onto its nearest
// double it hashed as another number, and a payload with another account
// id (18446744073709551615 and …614) or amount read as the same operation
// (QA, session 8). A literal whose exponent is beyond ±maxExponent keeps
// the float reading (the tiny ones are all 0).
func normalizeNumber(n json.Number) string {
	if i, err := n.Int64(); err == nil {
		return strconv.FormatInt(i, 10)
	}
	f, err := n.Float64()
	if err != nil {
		return n.String()
	}
	if d, ok := parseDecimal(n.String()); ok && len(d.digits) > 17 {
		if i, isInt := d.int64(); isInt {
			return strconv.FormatInt(i, 10) // 1234567890123456789.0 is the integer 1234567890123456789 is
		}
		if !d.holds(f) {
			return d.String()
		}
	}
	if f == float64(int64(f)) && f < 1e18 && f > -1e18 {
		return strconv.FormatInt(int64(f), 10)
	}
	b, _ := json.Marshal(f)
	return string(b)
}

// decimal is the exact value of a number literal: its sign, its significant
// digits (no leading or trailing zeros; "" for zero) and the power of ten of
// the first of them. It is read and written by string operations only, so
// its cost is linear in the literal whatever its exponent
// (1.00000000000000000001e-100000 costs what 1.5 does).
type decimal struct {
	neg    bool
	digits string
	exp    int
}

// maxExponent bounds the exponents parseDecimal reads, far beyond float64's
// (±324) and far below int overflow however long the literal.
const maxExponent = 1 << 40

// parseDecimal reads a JSON number literal; false when its exponent is
// beyond ±maxExponent.
func parseDecimal(lit string) (decimal, bool) {
	var d decimal
	if rest, ok := strings.CutPrefix(lit, "-"); ok {
		d.neg, lit = true, rest
	}
	mantissa, expPart, hasExp := strings.Cut(strings.ToLower(lit), "e")
	exp := 0
	if hasExp {
		v, err := strconv.Atoi(expPart)
		if err != nil || v > maxExponent || v < -maxExponent {
			return d, false // beyond any float64, and the sums below stay in range
		}
		exp = v
	}
	whole, frac, _ := strings.Cut(mantissa, ".")
	all := strings.TrimLeft(whole+frac, "0")
	d.digits = strings.TrimRight(all, "0")
	// The literal is whole+frac × 10^(exp - len(frac)); its first
	// significant digit stands len(all)-1 places above the last of all.
	d.exp = exp - len(frac) + len(all) - 1
	return d, true
}

// int64 is d when it is an integer an int64 holds: the same integer
// however it is spelled (9007199254740993, 9007199254740993.0, 9.007199254740993e15).
func (d decimal) int64() (int64, bool) {
	if d.digits == "" {
		return 0, true
	}
	if d.exp < len(d.digits)-1 || d.exp > 18 {
		return 0, false // a fraction, or beyond int64
	}
	text := d.digits + strings.Repeat("0", d.exp-len(d.digits)+1)
	if d.neg {
		text = "-" + text
	}
	i, err := strconv.ParseInt(text, 10, 64)
	return i, err == nil
}

// String writes d in scientific form, [-]D[.DDD]e<exp>: one spelling per
// value.
func (d decimal) String() string {
	if d.digits == "" {
		return "0"
	}
	var b strings.Builder
	if d.neg {
		b.WriteByte('-')
	}
	b.WriteString(d.digits[:1])
	if len(d.digits) > 1 {
		b.WriteByte('.')
		b.WriteString(d.digits[1:])
	}
	b.WriteByte('e')
	b.WriteString(strconv.Itoa(d.exp))
	return b.String()
}

// holds says whether d is one of f's own spellings: f's shortest decimal
// (0.1, 9.223372036854776e18) or f's exact binary value
// (9223372036854775808). Only a literal of at most 40 digits within ten
// to the ±400 is compared (a bounded big.Rat); any other is written
// exactly, which changes the encoding only of a literal that spells a
// float64's binary value in more than 40 digits.
func (d decimal) holds(f float64) bool {
	if len(d.digits) > 40 || d.exp > 400 || d.exp < -400 {
		return false
	}
	sign := ""
	if d.neg {
		sign = "-"
	}
	exact, ok := new(big.Rat).SetString(sign + d.digits + "e" + strconv.Itoa(d.exp-len(d.digits)+1))
	if !ok {
		return false
	}
	if shortest, ok := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64)); ok && shortest.Cmp(exact) == 0 {
		return true
	}
	binary := new(big.Rat).SetFloat64(f)
	return binary != nil && binary.Cmp(exact) == 0
}

// Hash returns hex SHA-256 of the canonical encoding of v.
func Hash(v any) (string, error) {
	b, err := Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
