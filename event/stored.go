package event

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// ErrCorrupt means stored bytes are not an event this build can decode.
var ErrCorrupt = errors.New("event: corrupt stored event")

// storedFormat is the first byte of the stored form. The JSON form that
// earlier releases stored starts with '{', so the two never collide.
const storedFormat = 0x01

// How a string field is stored. Most of an event's strings are ids that
// repeat another field or are UUIDs, so a field is usually one byte or 17.
const (
	fieldEmpty     = 0 // ""
	fieldSameID    = 1 // equal to the event's ID
	fieldSameStep  = 2 // equal to the event's StepID
	fieldSameExec  = 3 // equal to the execution id the caller supplies
	fieldUUID      = 4 // 16 bytes, rendered as a canonical lowercase UUID
	fieldHex16     = 5 // 16 bytes, rendered as 32 lowercase hex digits
	fieldType      = 6 // one byte: index into storedTypes
	fieldString    = 7 // uvarint length, then the bytes
	fieldSameCause = 8 // equal to the event's CausationID
	// fieldWithExec is a string holding the execution id, such as a
	// session id "sess-" + id or an idempotency key that starts with it:
	// the part before the id and the part after it, each as a uvarint
	// length and the bytes.
	fieldWithExec = 9
)

// The string fields of the stored form, in the order AppendStored writes
// them; a field may refer to one before it.
const (
	sfID = iota
	sfEventID
	sfType
	sfStep
	sfToolCall
	sfRun
	sfCause
	sfCorrelation
	sfSession
	sfAction
	sfTrace
	sfIdempotency
	nStored
)

// minExecRef is the shortest execution id that fieldWithExec refers to:
// with a shorter one the reference saves next to nothing.
const minExecRef = 8

// storedTypes numbers the event types for the stored form. Stored events
// refer to these indexes, so the list is append-only: never reorder or
// remove an entry.
var storedTypes = [...]string{
	ExecutionCreated, ExecutionStarted, ExecutionBlocked, ExecutionResumed,
	ExecutionCompleted, ExecutionFailed, ExecutionCancelled, ExecutionReset,
	IntentAccepted, IntentDenied,
	StepCreated, StepDispatched, StepStarted, StepCompleted, StepFailed,
	StepRetried, StepTimedOut, StepCancelled, StepApprovalRequired,
	SignalReceived, AgentTimeout, PermissionRequested, PermissionResolved,
	AgentOutput,
}

// knownTypes finds the kernel's event types by name.
var knownTypes = func() map[string]string {
	m := make(map[string]string, len(storedTypes))
	for _, t := range storedTypes {
		m[t] = t
	}
	return m
}()

// Known returns the kernel's event type named name, without allocating,
// and whether there is one: a replay names every event it sends.
func Known(name []byte) (string, bool) {
	t, ok := knownTypes[string(name)]
	return t, ok
}

// AppendStored appends the event's stored form to b: a compact binary
// encoding, about a third of the JSON form's size, that an event log keeps.
// It leaves out ExecutionID, which the log's key already holds, so
// DecodeStored must be given it back. Timestamps are kept in UTC.
func (e *Event) AppendStored(b []byte) []byte {
	b = append(b, storedFormat)
	b = e.appendField(b, e.ID, known{})
	b = e.appendField(b, e.EventID, known{id: e.ID})
	b = e.appendType(b)
	b = e.appendField(b, e.StepID, known{id: e.ID})
	k := known{id: e.ID, step: e.StepID}
	for _, s := range [...]string{e.ToolCallID, e.RunID, e.CausationID} {
		b = e.appendField(b, s, k)
	}
	k.cause = e.CausationID
	for _, s := range [...]string{e.CorrelationID, e.SessionID, e.ActionID, e.TraceID, e.IdempotencyKey} {
		b = e.appendField(b, s, k)
	}
	refs := ""
	if len(e.Refs) > 0 {
		data, _ := json.Marshal(e.Refs)
		refs = string(data)
	}
	b = e.appendField(b, refs, k)
	b = binary.AppendUvarint(b, uint64(e.SchemaVersion))
	b = binary.AppendUvarint(b, e.Sequence)
	ts := e.Timestamp.UTC()
	b = binary.AppendVarint(b, ts.Unix())
	b = binary.AppendUvarint(b, uint64(ts.Nanosecond()))
	return append(b, e.Payload...)
}

// known holds the fields a stored field may refer to: those the decoder
// has already read when it reaches it, empty before.
type known struct {
	id, step, cause string
}

// appendField stores s, by reference to the event's id, its step, its
// cause or its execution when it repeats one of them.
func (e *Event) appendField(b []byte, s string, k known) []byte {
	switch {
	case s == "":
		return append(b, fieldEmpty)
	case s == k.id:
		return append(b, fieldSameID)
	case s == k.step:
		return append(b, fieldSameStep)
	case s == k.cause:
		return append(b, fieldSameCause)
	case s == e.ExecutionID:
		return append(b, fieldSameExec)
	}
	// Only the forms that render back to s byte for byte: lowercase, and
	// a UUID with its hyphens where String puts them (Parse checks them).
	if len(s) == 36 && lowerHex(s, true) {
		if u, err := uuid.Parse(s); err == nil {
			return append(append(b, fieldUUID), u[:]...)
		}
	}
	if len(s) == 32 && lowerHex(s, false) {
		var raw [16]byte
		for i := range raw {
			raw[i] = unhex(s[2*i])<<4 | unhex(s[2*i+1])
		}
		return append(append(b, fieldHex16), raw[:]...)
	}
	if len(e.ExecutionID) >= minExecRef {
		if i := strings.Index(s, e.ExecutionID); i >= 0 {
			b = append(b, fieldWithExec)
			b = binary.AppendUvarint(b, uint64(i))
			b = append(b, s[:i]...)
			rest := s[i+len(e.ExecutionID):]
			b = binary.AppendUvarint(b, uint64(len(rest)))
			return append(b, rest...)
		}
	}
	b = append(b, fieldString)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendType stores the event's type, by its index in storedTypes when it
// has one.
func (e *Event) appendType(b []byte) []byte {
	for i, t := range storedTypes {
		if e.Type == t {
			return append(b, fieldType, byte(i))
		}
	}
	return e.appendField(b, e.Type, known{id: e.ID})
}

// lowerHex reports whether s is lowercase hex digits, with hyphens allowed
// when hyphens is set.
func lowerHex(s string, hyphens bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || hyphens && c == '-') {
			return false
		}
	}
	return true
}

// unhex is the value of a lowercase hex digit.
func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// DecodeStored decodes an event stored in the log of execution executionID,
// in the stored form or in the JSON form earlier releases stored. The
// payload aliases data.
func DecodeStored(data []byte, executionID string) (Event, error) {
	if len(data) > 0 && data[0] == '{' {
		var e Event
		if err := json.Unmarshal(data, &e); err != nil {
			return Event{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		return e, nil
	}
	var scratch [storedScratch]byte
	st, buf, err := decodeStored(data, executionID, scratch[:0])
	if err != nil {
		return Event{}, err
	}
	// One string holds every field, each a part of it: one allocation.
	all := string(buf)
	var fs [nStored]string
	for i := range nStored {
		from := 0
		if i > 0 {
			from = st.end[i-1]
		}
		fs[i] = all[from:st.end[i]]
	}
	if t, ok := Known(st.field(buf, sfType)); ok {
		fs[sfType] = t
	}
	e := Event{ID: fs[sfID], EventID: fs[sfEventID], Type: fs[sfType], StepID: fs[sfStep],
		ToolCallID: fs[sfToolCall], RunID: fs[sfRun], CausationID: fs[sfCause],
		CorrelationID: fs[sfCorrelation], SessionID: fs[sfSession], ActionID: fs[sfAction],
		TraceID: fs[sfTrace], IdempotencyKey: fs[sfIdempotency], ExecutionID: executionID,
		SchemaVersion: int(st.schema), Sequence: st.seq, Timestamp: st.ts, Payload: st.payload}
	if len(st.refs) > 0 {
		// Copies, so that what json.Unmarshal is given (which escapes)
		// keeps neither st's bytes nor e off the stack.
		var refs []Ref
		if err := json.Unmarshal(slices.Clone(st.refs), &refs); err != nil {
			return Event{}, fmt.Errorf("%w: refs", ErrCorrupt)
		}
		e.Refs = refs
	}
	return e, nil
}

// AppendStoredJSON appends the JSON form of a stored event of the log of
// execution executionID to b: what clients of the kernel API read. It
// copies each field once, from the stored bytes to b, with no Event and
// no string in between: a replay renders every event it sends. It also
// returns the event's type, which names the frame the event goes out in:
// one of the kernel's types allocates nothing.
func AppendStoredJSON(b, data []byte, executionID string) (_ []byte, typ string, _ error) {
	if len(data) > 0 && data[0] == '{' {
		return append(b, data...), jsonType(data), nil
	}
	var scratch [storedScratch]byte
	st, buf, err := decodeStored(data, executionID, scratch[:0])
	if err != nil {
		return b, "", err
	}
	if len(st.refs) > 0 {
		// Rare (large values kept elsewhere): the refs are checked and
		// written as Event's JSON writes them.
		e, err := DecodeStored(data, executionID)
		if err != nil {
			return b, "", err
		}
		return e.AppendJSON(b), e.Type, nil
	}
	typ, ok := Known(st.field(buf, sfType))
	if !ok {
		typ = string(st.field(buf, sfType))
	}
	// The execution id joins the fields in buf, as bytes like them.
	at := len(buf)
	buf = append(buf, executionID...)
	v := envelope[[]byte]{exec: buf[at:], plain: st.plain, schema: st.schema, seq: st.seq, ts: st.ts, payload: st.payload}
	for i := range nStored {
		v.fields[i] = st.field(buf, i)
	}
	return appendJSON(b, &v), typ, nil
}

// jsonType finds the type of an event stored in its JSON form (by earlier
// releases) without decoding the payload: Event's JSON writes its own
// "type" key before the payload, and the keys before it hold ids that
// cannot contain the pattern. It is empty when there is none.
func jsonType(data []byte) string {
	const key = `"type":"`
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return ""
	}
	rest := data[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	if t, ok := Known(rest[:j]); ok {
		return t
	}
	return string(rest[:j])
}

// stored is an event's stored form decoded with no string made: its
// string fields are held one after another in a buffer apart (see field),
// so that the buffer, on the caller's stack, does not follow the payload
// and the timestamp wherever they go.
type stored struct {
	end     [nStored]int
	n       int    // fields decoded
	plain   uint16 // bit i: field i needs no escaping in JSON (see plainField)
	refs    []byte
	schema  uint64
	seq     uint64
	ts      time.Time
	payload []byte
}

// storedScratch is the room a stored event's fields take on the stack:
// with it, an event whose fields fit (any of the kernel's) decodes with no
// allocation.
const storedScratch = 512

// field is string field i in buf, the fields' buffer: the bytes from
// end[i-1] to end[i]; nothing when it has not been decoded (a reference to
// a later field, which AppendStored never writes).
func (st *stored) field(buf []byte, i int) []byte {
	if i >= st.n {
		return nil
	}
	start := 0
	if i > 0 {
		start = st.end[i-1]
	}
	return buf[start:st.end[i]:st.end[i]]
}

// decodeStored decodes the stored form in data, its string fields
// appended to buf, which it returns. (A function returning values, not a
// method filling a struct, keeps buf where the caller has it: on its
// stack.)
func decodeStored(data []byte, exec string, buf []byte) (stored, []byte, error) {
	if len(data) == 0 || data[0] != storedFormat {
		return stored{}, buf, fmt.Errorf("%w: unknown format", ErrCorrupt)
	}
	d := decoder{data: data[1:], exec: exec}
	var st stored
	for i := range nStored {
		var plain bool
		buf, plain = d.field(&st, buf, buf)
		st.end[i] = len(buf)
		st.n = i + 1
		if plain {
			st.plain |= 1 << i
		}
	}
	// The refs, stored as a string field after the others, are JSON and
	// usually empty: they are kept as bytes of their own.
	st.refs, _ = d.field(&st, buf, nil)
	st.schema = d.uvarint()
	st.seq = d.uvarint()
	sec := d.varint()
	nsec := d.uvarint()
	if d.err != nil {
		return stored{}, buf, d.err
	}
	if nsec >= uint64(time.Second) {
		return stored{}, buf, fmt.Errorf("%w: timestamp", ErrCorrupt)
	}
	st.ts = time.Unix(sec, int64(nsec)).UTC()
	if len(d.data) > 0 {
		st.payload = d.data
	}
	return st, buf, nil
}

// decoder reads the stored form; the first error sticks and makes every
// later read return zero.
type decoder struct {
	data []byte
	exec string
	err  error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
	d.data = nil
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || n < 0 || len(d.data) < n {
		d.fail("truncated")
		return nil
	}
	p := d.data[:n]
	d.data = d.data[n:]
	return p
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.data = d.data[n:]
	return v
}

// varint reads what binary.AppendVarint wrote: a zig-zag encoded uvarint.
func (d *decoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// bytes reads a uvarint length and that many bytes.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.data)) {
		d.fail("string length")
		return nil
	}
	return d.take(int(n))
}

// field reads one string field and appends its bytes to b; st and buf
// hold the fields decoded so far, which the references point back to. It
// also reports whether the field is known to need no escaping in JSON
// (hex, a UUID, a kernel type, or a copy of a field that is), which spares
// the rendering a scan of it; false means only that it must be scanned.
func (d *decoder) field(st *stored, buf, b []byte) (_ []byte, plain bool) {
	tag := d.take(1)
	if tag == nil {
		return b, false
	}
	switch tag[0] {
	case fieldEmpty:
		return b, true
	case fieldSameID:
		return append(b, st.field(buf, sfID)...), st.plainField(sfID)
	case fieldSameStep:
		return append(b, st.field(buf, sfStep)...), st.plainField(sfStep)
	case fieldSameCause:
		return append(b, st.field(buf, sfCause)...), st.plainField(sfCause)
	case fieldSameExec:
		b = append(b, d.exec...)
	case fieldUUID:
		if p := d.take(16); p != nil {
			return appendUUID(b, p), true
		}
	case fieldHex16:
		if p := d.take(16); p != nil {
			return hex.AppendEncode(b, p), true
		}
	case fieldType:
		if p := d.take(1); p != nil {
			if int(p[0]) < len(storedTypes) {
				return append(b, storedTypes[p[0]]...), true
			}
			d.fail("type index")
		}
	case fieldString:
		b = append(b, d.bytes()...)
	case fieldWithExec:
		before := d.bytes()
		after := d.bytes()
		if d.err == nil {
			b = append(append(append(b, before...), d.exec...), after...)
		}
	default:
		d.fail("field tag")
	}
	return b, false
}

// plainField reports whether field i, decoded, needs no escaping in JSON.
func (st *stored) plainField(i int) bool { return i < st.n && st.plain&(1<<i) != 0 }

// appendUUID appends the 16 bytes of u as a canonical lowercase UUID,
// as uuid.UUID's String writes it.
func appendUUID(b, u []byte) []byte {
	b = hex.AppendEncode(b, u[0:4])
	b = append(b, '-')
	b = hex.AppendEncode(b, u[4:6])
	b = append(b, '-')
	b = hex.AppendEncode(b, u[6:8])
	b = append(b, '-')
	b = hex.AppendEncode(b, u[8:10])
	b = append(b, '-')
	return hex.AppendEncode(b, u[10:16])
}
