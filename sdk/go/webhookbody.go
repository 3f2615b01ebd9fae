package ratchet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"
)

// The body of a delivery is read alike by the three SDKs (the shared
// vectors in ../webhook_vectors.json hold them to it), and strictly: the
// server sends an event as encoding/json writes it, so anything odd is no
// event of Ratchet's. A body is one JSON object in UTF-8 (no byte-order
// mark; JSON whitespace around it), nesting at most maxEventNesting
// levels, with no name twice in any object, no number beyond float64 and
// no lone UTF-16 surrogate escape; id, type, workspace_id and subject_id
// are strings (or null), created_at an RFC 3339 time (or null) as
// rfc3339Time reads it. Names are exact: encoding/json alone matched "ID"
// to id, which the other SDKs read as another member.

// maxEventNesting bounds how deep arrays and objects nest in an event (the
// event object itself is the first level): an event carries ids and
// states, and Python's json module recurses once a level.
const maxEventNesting = 64

// rfc3339Time is RFC 3339 as the server writes it (time.RFC3339Nano):
// upper-case T and Z, at most nine fraction digits, the fields in range.
var rfc3339Time = regexp.MustCompile(`^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?(Z|[+-]([0-9]{2}):([0-9]{2}))$`)

// decodeWebhookEvent reads a verified body as an event.
func decodeWebhookEvent(body []byte) (*WebhookEvent, error) {
	if err := checkEventBody(body); err != nil {
		return nil, fmt.Errorf("ratchet: decode webhook event: %w", err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, fmt.Errorf("ratchet: decode webhook event: %w", err)
	}
	ev := &WebhookEvent{Data: members["data"]}
	for name, field := range map[string]*string{"id": &ev.ID, "type": &ev.Type, "workspace_id": &ev.WorkspaceID,
		"subject_id": &ev.SubjectID} {
		if raw, ok := members[name]; ok && json.Unmarshal(raw, field) != nil {
			return nil, fmt.Errorf("ratchet: decode webhook event: %q is not a string", name)
		}
	}
	if raw, ok := members["created_at"]; ok && string(raw) != "null" {
		var s string
		if json.Unmarshal(raw, &s) != nil || !validEventTime(s) {
			return nil, errors.New(`ratchet: decode webhook event: "created_at" is not an RFC 3339 time`)
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, errors.New(`ratchet: decode webhook event: "created_at" is not an RFC 3339 time`)
		}
		ev.CreatedAt = t
	}
	return ev, nil
}

// validEventTime reports whether s is an RFC 3339 time as rfc3339Time
// says, its date one of the calendar's.
func validEventTime(s string) bool {
	m := rfc3339Time.FindStringSubmatch(s)
	if m == nil {
		return false
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	year, month, day := n(1), n(2), n(3)
	if month < 1 || month > 12 || day < 1 || n(4) > 23 || n(5) > 59 || n(6) > 59 {
		return false
	}
	if m[8] != "Z" && (n(9) > 23 || n(10) > 59) {
		return false
	}
	return day <= time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// checkEventBody refuses a body that is not one JSON object as the shared
// rules above read it.
func checkEventBody(body []byte) error {
	if !utf8.Valid(body) {
		return errors.New("not UTF-8")
	}
	if err := scanEventText(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object  bool
		wantKey bool
		names   map[string]bool
	}
	var stack []*frame
	for first := true; ; first = false {
		tok, err := dec.Token()
		if err == io.EOF && first {
			return errors.New("empty: not a JSON object")
		}
		if err == io.EOF && len(stack) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
		if first && tok != json.Delim('{') {
			return errors.New("not a JSON object")
		}
		if !first && len(stack) == 0 {
			return errors.New("more after the object")
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantKey && tok != json.Delim('}') {
			name := tok.(string)
			if top.names[name] {
				return fmt.Errorf("the name %q twice in one object", name)
			}
			top.names[name] = true
			top.wantKey = false
			continue
		}
		if top != nil && top.object {
			top.wantKey = true // after this value (a closing brace pops the frame)
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, &frame{object: true, wantKey: true, names: map[string]bool{}})
			case '[':
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if f, _ := strconv.ParseFloat(string(v), 64); math.IsInf(f, 0) {
				return fmt.Errorf("the number %.20s… is beyond float64", string(v))
			}
		}
	}
}

// scanEventText bounds the body's nesting and refuses a \u escape of a
// lone UTF-16 surrogate, which encoding/json reads as U+FFFD and the other
// SDKs' parsers keep: no character either way. Syntax is the decoder's.
func scanEventText(body []byte) error {
	depth, inString := 0, false
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case inString && c == '"':
			inString = false
		case inString && c == '\\' && i+1 < len(body):
			i++
			if body[i] != 'u' {
				continue
			}
			r, ok := hex4(body, i+1)
			if !ok {
				continue // the decoder says why
			}
			i += 4
			switch {
			case r >= 0xd800 && r < 0xdc00:
				if low, ok := hex4(body, i+3); i+2 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' && ok &&
					low >= 0xdc00 && low < 0xe000 {
					i += 6
					continue
				}
				return errors.New("a lone surrogate escape")
			case r >= 0xdc00 && r < 0xe000:
				return errors.New("a lone surrogate escape")
			}
		case inString:
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > maxEventNesting {
				return fmt.Errorf("nests deeper than %d levels", maxEventNesting)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}

// hex4 reads the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(v), err == nil
}
