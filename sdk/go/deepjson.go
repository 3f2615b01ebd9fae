package ratchet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// maxNesting is how many levels of arrays and objects encoding/json reads
// and writes in one value (its maxNestingDepth), and how deep the API reads
// a request body.
const maxNesting = 10000

// errOutputTooDeep is why a handler's output nested deeper than
// maxNesting is not sent: no report holding it can be encoded.
var errOutputTooDeep = fmt.Errorf("nests arrays and objects more than %d levels deep", maxNesting)

// tooDeep reports whether err is encoding/json's refusal of a value nested
// more than maxNesting levels.
func tooDeep(err error) bool {
	var syn *json.SyntaxError
	return errors.As(err, &syn) && strings.HasSuffix(syn.Error(), "exceeded max depth")
}

// deepAnswer is an answer read by its parts when it nests deeper than
// encoding/json reads whole: a free-form value the server took at up to
// its body's depth, carried further down by the answer around it.
type deepAnswer interface{ unmarshalDeep(raw []byte) error }

// claimAnswer is a claim's answer.
type claimAnswer struct {
	Jobs []ClaimedJob `json:"jobs"`
	date time.Time    // its Date header (setServerDate)
}

// unmarshalDeep reads a claim answer job by job. The answer carries each
// input three levels down ({"jobs": [{"input": …}]}), so an input the
// server took 9 998 or 9 999 levels deep made the whole answer deeper than
// encoding/json reads: every job in it lapsed unrun, and came back at every
// claim. One job is read as json.Unmarshal reads it; one whose input alone
// nests deeper than that is read member by member, its input kept as sent
// (the handler's decoding then fails that job alone, not retried).
func (a *claimAnswer) unmarshalDeep(raw []byte) error {
	a.Jobs = nil
	dec := json.NewDecoder(bytes.NewReader(raw))
	return members(dec, raw, func(key string, value []byte) error {
		if !strings.EqualFold(key, "jobs") {
			return nil // as json.Unmarshal leaves an unknown member
		}
		a.Jobs = nil
		return elements(value, func(elem []byte) error {
			var j ClaimedJob
			err := json.Unmarshal(elem, &j)
			if tooDeep(err) {
				err = unmarshalJobDeep(elem, &j)
			}
			if err != nil {
				return err
			}
			a.Jobs = append(a.Jobs, j)
			return nil
		})
	})
}

// unmarshalJobDeep reads a claimed job whose input nests deeper than
// encoding/json reads: every other member as json.Unmarshal reads it, the
// input (its last, as json.Unmarshal keeps) as sent.
func unmarshalJobDeep(raw []byte, j *ClaimedJob) error {
	var shallow bytes.Buffer
	var input []byte
	shallow.WriteByte('{')
	err := members(json.NewDecoder(bytes.NewReader(raw)), raw, func(key string, value []byte) error {
		if strings.EqualFold(key, "input") {
			input = value
			return nil
		}
		if shallow.Len() > 1 {
			shallow.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		shallow.Write(k)
		shallow.WriteByte(':')
		shallow.Write(value)
		return nil
	})
	if err != nil {
		return err
	}
	shallow.WriteByte('}')
	if err := json.Unmarshal(shallow.Bytes(), j); err != nil {
		return err
	}
	if input != nil {
		j.Input = append(json.RawMessage(nil), input...)
	}
	return nil
}

// members calls f with each member of the JSON object raw, whose decoder
// dec is, with the member's value as sent; any depth is read (the
// decoder's tokens have no nesting limit). A null is no object and no
// member, as json.Unmarshal reads it into a struct.
func members(dec *json.Decoder, raw []byte, f func(key string, value []byte) error) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return trailing(dec)
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("json: cannot read %v as an object", tok)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		value, err := nextValue(dec, raw)
		if err != nil {
			return err
		}
		if err := f(key, value); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return err
	}
	return trailing(dec)
}

// elements calls f with each element of the JSON array raw, as sent; null
// is no array and no element.
func elements(raw []byte, f func(elem []byte) error) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return trailing(dec)
	}
	if tok != json.Delim('[') {
		return fmt.Errorf("json: cannot read %v as an array", tok)
	}
	for dec.More() {
		elem, err := nextValue(dec, raw)
		if err != nil {
			return err
		}
		if err := f(elem); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return err
	}
	return trailing(dec)
}

// nextValue reads the value dec is at, and answers its bytes in raw.
func nextValue(dec *json.Decoder, raw []byte) ([]byte, error) {
	start := int(dec.InputOffset())
	// Past what separates it from the token before: whitespace, and the
	// ':' after a key or the ',' after an element or member.
	for start < len(raw) && strings.IndexByte(" \t\r\n:,", raw[start]) >= 0 {
		start++
	}
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return raw[start:dec.InputOffset()], nil
		}
	}
}

// trailing refuses anything after the value dec read, as json.Unmarshal
// does.
func trailing(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("json: invalid character after top-level value")
	}
	return nil
}
