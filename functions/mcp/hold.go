package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

// A ratchet_begin the client cancels after the server granted it leaves a
// lease whose token reached no one. Given back at once (reported failed,
// mcpserver.ReleaseUnseen), it spent an attempt though nothing acted: under
// max_attempts 1 the client's next begin of the key was refused
// max_attempts_exceeded for good (MCP QA). Instead, a begin without a
// request_id is sent under one of the binary's own, and the lease of one
// cancelled is held for a while: the client's next begin of the same effect
// type and idempotency key is sent under that request_id, and the server
// answers it with the same lease (its documented recovery of a lost answer,
// gate.rejoin), the attempt not spent. Only the client that was granted the
// lease can rejoin it (the same key, the same process), so no one else can
// act under it; a lease no begin rejoins within the hold, or still held
// when stdin ends, is given back as before.

// maxHold bounds the hold: long enough for a client that retries a call
// it cancelled (its own timeout, say), short enough that the key is not
// kept from others for long. A hold also ends halfway to the lease's expiry
// by this process's clock, so a short lease is given back before it lapses.
const maxHold = 10 * time.Second

// beginKey names what a begin acts on: its effect type and idempotency key.
type beginKey struct{ effectType, idempotencyKey string }

// heldLease is a cancelled begin's lease, kept for a begin of its key to
// rejoin from the cancellation on: a begin sent again at once may come
// before the cancelled one's answer does, and the server answers both with
// the same lease (its token derives from the request_id).
type heldLease struct {
	requestID string
	result    json.RawMessage // the dropped tool result, for release; nil until it came
	timer     *time.Timer     // ends the hold once result came
	taken     bool            // rejoined, or given back (mu)
	// rejoining is set while a begin sent to rejoin it (request.rejoins)
	// is unanswered: refused, that begin leaves the lease held again
	// (rejoinAnswered).
	rejoining bool
}

// underRequestID is line, a tools/call of ratchet_begin without a
// request_id (r.begin), sent under one: the request_id of the lease held
// for its key, which it then rejoins, or a new one. It records the key and
// the request_id in r. A line it cannot rewrite is passed on as it is. mu
// is held.
func (d *drainingPipes) underRequestID(line []byte, params json.RawMessage, r *request) []byte {
	var call struct {
		Arguments json.RawMessage `json:"arguments"`
	}
	var args struct {
		EffectType     string `json:"effect_type"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	// Arguments the tool refuses as REST refuses a body are passed on as
	// sent: re-encoded (withRequestID), a member named twice was folded
	// into its last, and the begin ran where the tool refuses it (MCP
	// review: granted execute, where the HTTP endpoint answers
	// invalid_request).
	if json.Unmarshal(params, &call) != nil || jsonstrict.Check(call.Arguments, nil) != nil ||
		json.Unmarshal(call.Arguments, &args) != nil || args.EffectType == "" || args.IdempotencyKey == "" {
		return line // refused by the tool: nothing to rejoin
	}
	key := beginKey{args.EffectType, args.IdempotencyKey}
	h := d.held[key]
	var id string
	if h != nil {
		id = h.requestID
	} else {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return line
		}
		id = hex.EncodeToString(b[:])
	}
	out, ok := withRequestID(line, id)
	if !ok {
		return line
	}
	if h != nil { // rejoined: this begin's answer holds the lease, unless it is refused (rejoinAnswered)
		h.taken, h.rejoining = true, true
		if h.timer != nil {
			h.timer.Stop()
		}
		delete(d.held, key)
		r.rejoins = h
	}
	r.key, r.requestID = key, id
	return out
}

// rejoinAnswered settles the held lease r was sent to rejoin (underRequestID)
// now that r is answered with result (nil for a JSON-RPC error). An execute
// holds the key's lease: the held one, or a later one once it ended. Any
// other answer (rate_limited, database_unavailable, server_unreachable, an
// argument refused) rejoined nothing, and the lease, whose token no one
// holds, is held again for the next begin of its key and given back when
// the hold ends, as before r came (MCP review: it was dropped, and lapsed,
// the key answering in_flight, then blocked until an operator resolved it).
// Another begin of the key holding its place, or stdin's end, gives it back
// at once. mu is held.
func (d *drainingPipes) rejoinAnswered(r *request, result json.RawMessage) {
	h := r.rejoins
	h.rejoining = false
	if _, ok := mcpserver.GrantOf(result); ok {
		return
	}
	if own := r.held; own != nil && d.held[r.key] == own {
		// r was cancelled too: its own hold holds nothing, its answer
		// granting nothing.
		own.taken = true
		delete(d.held, r.key)
	}
	h.taken = false
	if d.ended || d.held[r.key] != nil {
		if h.result != nil {
			h.taken = true
			d.releaseUnseen(h.result)
		}
		return // its result still to come: given back then (dropped)
	}
	d.held[r.key] = h
	if h.result != nil {
		d.keep(h, r.key)
	}
}

// withRequestID is line, a tools/call message, with request_id set among
// its params' arguments; every other member is kept as it was sent. ok is
// false when line does not decode as such (nested past what encoding/json
// reads, say).
func withRequestID(line []byte, id string) (_ []byte, ok bool) {
	var msg, params, args map[string]json.RawMessage
	if json.Unmarshal(line, &msg) != nil || json.Unmarshal(msg["params"], &params) != nil ||
		json.Unmarshal(params["arguments"], &args) != nil || args == nil {
		return nil, false
	}
	args["request_id"], _ = json.Marshal(id)
	encode := func(v any) (json.RawMessage, bool) {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if enc.Encode(v) != nil {
			return nil, false
		}
		return bytes.TrimSpace(b.Bytes()), true
	}
	if params["arguments"], ok = encode(args); !ok {
		return nil, false
	}
	if msg["params"], ok = encode(params); !ok {
		return nil, false
	}
	return encode(msg)
}

// holdFrom keeps, from its cancellation on, the lease r (a begin sent under
// a request_id of the binary's own) may be granted, for a begin of its key
// to rejoin. A lease still held for the key, another begin's, is given back
// (or, its answer still to come, given back when it comes). mu is held.
func (d *drainingPipes) holdFrom(r *request) {
	if r.requestID == "" || r.held != nil || d.ended {
		return
	}
	if old := d.held[r.key]; old != nil {
		delete(d.held, r.key)
		if old.result != nil && !old.taken {
			old.taken = true
			old.timer.Stop()
			d.releaseUnseen(old.result)
		}
	}
	r.held = &heldLease{requestID: r.requestID}
	d.held[r.key] = r.held
}

// dropped settles a cancelled begin whose result was dropped: a lease no
// one rejoined is held until a begin of its key does, or the hold
// (holdFor) ends, and then given back (releaseUnseen); at once when stdin
// has ended or the begin was not held (holdFrom). A lease rejoined is the
// rejoining begin's. mu is held.
func (d *drainingPipes) dropped(r *request, result json.RawMessage) {
	h := r.held
	if h != nil && h.rejoining {
		// A begin of its key went to rejoin it and is not yet answered:
		// refused, it leaves the lease held again (rejoinAnswered).
		if _, ok := mcpserver.GrantOf(result); ok {
			h.result = result
		}
		return
	}
	if h == nil || d.ended || d.held[r.key] != h {
		if h == nil || !h.taken {
			d.releaseUnseen(result)
		}
		return
	}
	if _, ok := mcpserver.GrantOf(result); !ok {
		// No lease to give back; but a begin of the key still goes under
		// its request_id, which rejoins a lease granted to a call whose
		// answer was lost (server_unreachable, outcome unknown).
		return
	}
	h.result = result
	d.keep(h, r.key)
}

// keep ends the hold of h, held for key with its result, after holdFor:
// unless a begin rejoined it, it is given back then. mu is held.
func (d *drainingPipes) keep(h *heldLease, key beginKey) {
	grant, _ := mcpserver.GrantOf(h.result)
	h.timer = time.AfterFunc(d.holdFor(grant), func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if !h.taken {
			h.taken = true
			if d.held[key] == h {
				delete(d.held, key)
			}
			d.releaseUnseen(h.result)
		}
	})
}

// holdFor is how long a lease is held once its grant came: maxHold, or
// half the time to its expiry by this process's clock when that is shorter
// (at once when the expiry does not read, or has passed).
func (d *drainingPipes) holdFor(g mcpserver.Grant) time.Duration {
	expires, err := time.Parse(time.RFC3339Nano, g.LeaseExpiresAt)
	if err != nil {
		return 0
	}
	return max(min(time.Until(expires)/2, d.maxHold), 0)
}

// releaseHeld gives back every lease held, and those of cancelled begins
// still to be answered once they are: stdin has ended, and no begin will
// come to rejoin them. mu is held.
func (d *drainingPipes) releaseHeld() {
	d.ended = true
	for key, h := range d.held {
		delete(d.held, key)
		if h.result != nil && !h.taken {
			h.taken = true
			h.timer.Stop()
			d.releaseUnseen(h.result)
		}
	}
}

// giveBackHeld gives back the leases held, for a process ending before its
// stdin does (an interrupt), and waits up to timeout for them.
func (d *drainingPipes) giveBackHeld(timeout time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releaseHeld()
	d.waitFor(timeout, func() bool { return d.releasing == 0 })
}
