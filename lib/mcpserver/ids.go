package mcpserver

import (
	"encoding/json"
	"strconv"
	"strings"
)

// BadIDMessage is the message of the Invalid Request error that refuses a
// message whose id could not be answered exactly (answerableID).
const BadIDMessage = "Invalid Request: id must be a string or an integer from -(2^53 - 1) to 2^53 - 1"

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
	case c == '"' || string(id) == "null":
		return true // a string; null, the SDK's to refuse as a missing id
	case c != '-' && (c < '0' || c > '9'):
		// true, false, an object or an array: no id. The SDK refused one
		// in words naming its Go type ("invalid ID type map[string]interface
		// {}", MCP review), where this says what an id may be.
		return false
	}
	return exactInteger(string(id))
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
