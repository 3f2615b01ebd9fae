package mcpserver

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// BadIDMessage is the message of the Invalid Request error that refuses a
// message whose id could not be answered exactly (answerableID).
const BadIDMessage = "Invalid Request: id must be a string (UTF-8, without a lone UTF-16 surrogate) or an integer " +
	"from -(2^53 - 1) to 2^53 - 1"

// maxExactID is the largest integer every JSON reader, the SDK's included
// (it reads ids as float64), holds exactly.
const maxExactID = 1<<53 - 1

var maxExactIDDigits = strconv.Itoa(maxExactID)

// answerableID reports whether a message's id (its raw member, nil when it
// has none) can be carried back exactly by its answer: none, a string, or
// an integer within ±(2^53 - 1), however spelt. The SDK reads numeric ids as
// float64 and answered 12345678901234567890 as -9223372036854775808 and 1.5
// as 1 (MCP QA), so a client could not match the answer, or, over stdio, a
// 7.5 was taken for the 7 still in progress and never answered. JSON-RPC
// wants the id returned unchanged and MCP's ids are strings or integers:
// such a message is refused instead (CheckEnvelope, BadIDMessage). The
// members are read as a map, not a struct: encoding/json would take "ID"
// for "id", which the SDK does not (to it, such a message has no id).
func answerableID(id json.RawMessage) bool {
	if len(id) == 0 {
		return true // no id: a notification
	}
	c := id[0]
	switch {
	case c == '"':
		return exactString(string(id))
	case string(id) == "null":
		return true // the SDK's to refuse as a missing id
	case c != '-' && (c < '0' || c > '9'):
		// true, false, an object or an array: no id. The SDK refused one
		// in words naming its Go type ("invalid ID type map[string]interface
		// {}", MCP review), where this says what an id may be.
		return false
	}
	return exactInteger(string(id))
}

// ExactStringID reports whether id, a JSON string literal (an id's raw
// member), is answered as sent: the stdio binary reads the id of a line it
// refuses unread (one over its limit) for itself, and answers it only when
// it is (exactString).
func ExactStringID(id json.RawMessage) bool {
	return len(id) > 0 && id[0] == '"' && exactString(string(id))
}

// exactString reports whether lit, a JSON string literal, decodes to the
// text it spells. encoding/json, which the SDK reads ids with, reads bytes
// that are not UTF-8, and a \u escape of a lone UTF-16 surrogate, as U+FFFD
// (MCP QA: "\ud800" was answered as "\ufffd", an id the client never sent,
// and "\ud800" and "\udbff" were one id in a batch). lit is valid JSON
// (CheckEnvelope), so each escape is whole.
func exactString(lit string) bool {
	if !utf8.ValidString(lit) {
		return false
	}
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if lit[i] != 'u' {
			continue
		}
		r := hexRune(lit[i+1 : i+5])
		i += 4
		if !utf16.IsSurrogate(r) {
			continue
		}
		// A high surrogate is whole only with a low one after it.
		if r >= 0xDC00 || !strings.HasPrefix(lit[i+1:], `\u`) || i+6 >= len(lit) {
			return false
		}
		if low := hexRune(lit[i+3 : i+7]); low < 0xDC00 || low > 0xDFFF {
			return false
		}
		i += 6
	}
	return true
}

// hexRune reads four hex digits (-1 when they are not).
func hexRune(digits string) rune {
	v, err := strconv.ParseUint(digits, 16, 32)
	if err != nil {
		return -1
	}
	return rune(v)
}

// exactInteger reports whether the JSON number literal n is an integer
// within ±(2^53 - 1), however it is spelt (1.0 and 10e-1 are 1, which the
// SDK answers as 1: the same value). It reads the literal's digits rather
// than parsing it, so that neither a long one nor a huge exponent costs
// more than its length.
func exactInteger(n string) bool {
	n = strings.TrimPrefix(n, "-")
	mantissa, exponent, _ := strings.Cut(strings.ToLower(n), "e")
	whole, fraction, _ := strings.Cut(mantissa, ".")
	shift := 0
	if exponent != "" {
		e, err := strconv.Atoi(strings.TrimPrefix(exponent, "+"))
		if err != nil || e > 1000 || e < -1000 {
			return strings.Trim(whole+fraction, "0") == "" // zero, whatever its exponent
		}
		shift = e
	}
	digits := whole + fraction
	shift -= len(fraction)
	trimmed := strings.TrimRight(digits, "0")
	shift += len(digits) - len(trimmed)
	trimmed = strings.TrimLeft(trimmed, "0")
	switch {
	case trimmed == "":
		return true // zero
	case shift < 0:
		return false // a fraction
	case len(trimmed)+shift > len(maxExactIDDigits):
		return false
	}
	v, err := strconv.ParseInt(trimmed+strings.Repeat("0", shift), 10, 64)
	return err == nil && v <= maxExactID
}
