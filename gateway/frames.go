package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gatehouse-dev/gatehouse/event"
)

// WebSocket subprotocols. Both carry the same frame shapes; docs/websocket.md
// describes them.
const (
	// SubprotocolJSON selects JSON text frames. A client that offers no
	// subprotocol gets it too.
	SubprotocolJSON = "gatehouse.v1.json"
	// SubprotocolMsgpack selects msgpack binary frames.
	SubprotocolMsgpack = "gatehouse.v1.msgpack"
)

// wireFormat is the frame encoding of one socket.
type wireFormat uint8

const (
	formatJSON wireFormat = iota
	formatMsgpack
)

// formatOf maps a negotiated subprotocol to its encoding.
func formatOf(subprotocol string) wireFormat {
	if strings.EqualFold(subprotocol, SubprotocolMsgpack) {
		return formatMsgpack
	}
	return formatJSON
}

func (f wireFormat) messageType() websocket.MessageType {
	if f == formatMsgpack {
		return websocket.MessageBinary
	}
	return websocket.MessageText
}

// Frame types.
const (
	frameHello    = "hello"
	frameDelivery = "delivery"
	frameEvent    = "event"
	frameReply    = "reply"
	frameReset    = "reset"
	frameAck      = "ack"
	frameResume   = "resume"
	frameCommand  = "command"
	frameRefresh  = "refresh"
)

// maxFrameID bounds the id a client gives a frame; it comes back in the
// reply, so it must stay small.
const maxFrameID = 128

// maxDepth bounds the nesting of a msgpack frame, as encoding/json bounds
// JSON: a tiny frame of nested one-element arrays must not cost a deep
// recursion.
const maxDepth = 10000

// inFrame is a decoded client frame. Both encodings decode into it, the
// msgpack one by way of JSON, so they cannot disagree on shapes.
type inFrame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Seq     uint64          `json:"seq"`
	Cursor  uint64          `json:"cursor"`
	Epoch   string          `json:"epoch"`
	Command string          `json:"command"`
	Body    json.RawMessage `json:"body"`
	Token   string          `json:"token"`
}

// frameError is a client frame that cannot be used. When the frame carried a
// usable id the error is answered with an error reply; otherwise nothing can
// be correlated and the socket closes with 1007.
type frameError struct {
	id  string
	msg string
}

func (e *frameError) Error() string { return "malformed frame: " + e.msg }

// decodeFrame decodes and checks one client frame.
func decodeFrame(f wireFormat, data []byte) (inFrame, error) {
	if f == formatMsgpack {
		j, err := msgpackToJSON(data)
		if err != nil {
			return inFrame{}, &frameError{msg: err.Error()}
		}
		data = j
	}
	if err := checkJSONText(data); err != nil {
		return inFrame{}, &frameError{msg: err.Error()}
	}
	var fr inFrame
	if err := json.Unmarshal(data, &fr); err != nil {
		// A field of the wrong type still leaves the others decoded, the
		// id among them.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && validFrameID(fr.ID) {
			return inFrame{}, &frameError{id: fr.ID, msg: err.Error()}
		}
		return inFrame{}, &frameError{msg: err.Error()}
	}
	if !validFrameID(fr.ID) && fr.ID != "" {
		return inFrame{}, &frameError{msg: "id longer than " + strconv.Itoa(maxFrameID) + " bytes"}
	}
	switch fr.Type {
	case frameAck:
		if fr.Seq == 0 {
			return inFrame{}, &frameError{id: fr.ID, msg: "an ack needs seq of at least 1"}
		}
	case frameResume:
	case frameCommand:
		if fr.ID == "" {
			return inFrame{}, &frameError{msg: "a command needs an id"}
		}
		if fr.Command == "" {
			return inFrame{}, &frameError{id: fr.ID, msg: "a command needs a command name"}
		}
	case frameRefresh:
		if fr.ID == "" {
			return inFrame{}, &frameError{msg: "a refresh needs an id"}
		}
		if fr.Token == "" {
			return inFrame{}, &frameError{id: fr.ID, msg: "a refresh needs a token"}
		}
	case "":
		return inFrame{}, &frameError{id: fr.ID, msg: "missing frame type"}
	default:
		return inFrame{}, &frameError{id: fr.ID, msg: "unknown frame type " + strconv.Quote(fr.Type)}
	}
	return fr, nil
}

func validFrameID(id string) bool { return id != "" && len(id) <= maxFrameID }

// Outgoing frames are built as JSON, splicing in the stored JSON payloads
// without decoding them; a msgpack socket converts the finished frame.

// appendHello appends the first frame of every socket. consumer is empty
// on the execution socket.
func appendHello(b []byte, epoch, role, id, consumer string, heartbeat time.Duration) []byte {
	b = openFrame(b, frameHello)
	b = append(b, `,"epoch":`...)
	b = event.AppendJSONString(b, epoch)
	b = append(b, `,"role":`...)
	b = event.AppendJSONString(b, role)
	b = append(b, `,"id":`...)
	b = event.AppendJSONString(b, id)
	if consumer != "" {
		b = append(b, `,"consumer_id":`...)
		b = event.AppendJSONString(b, consumer)
	}
	b = append(b, `,"heartbeat_ms":`...)
	b = strconv.AppendInt(b, heartbeat.Milliseconds(), 10)
	return append(b, '}')
}

// appendPush appends a delivery or event frame; data is its JSON payload.
func appendPush(b []byte, typ string, seq uint64, eventType string, data []byte) []byte {
	b = openFrame(b, typ)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"event":`...)
	b = event.AppendJSONString(b, eventType)
	b = append(b, `,"data":`...)
	b = appendRaw(b, data)
	return append(b, '}')
}

// appendReply appends the answer to a command; body is the JSON the HTTP
// endpoint answers with.
func appendReply(b []byte, id string, status int, body []byte) []byte {
	b = openFrame(b, frameReply)
	b = append(b, `,"id":`...)
	b = event.AppendJSONString(b, id)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"body":`...)
	b = appendRaw(b, body)
	return append(b, '}')
}

// appendReset appends the notice that the socket cannot resume where the
// client asked; data is the same object an SSE stream.reset carries.
func appendReset(b []byte, data []byte) []byte {
	b = openFrame(b, frameReset)
	b = append(b, `,"data":`...)
	b = appendRaw(b, data)
	return append(b, '}')
}

func openFrame(b []byte, typ string) []byte {
	b = append(b, `{"type":`...)
	return event.AppendJSONString(b, typ)
}

func appendRaw(b, data []byte) []byte {
	if len(data) == 0 {
		return append(b, "null"...)
	}
	return append(b, data...)
}

// encodeFrame returns a finished JSON frame in the socket's encoding; a
// msgpack frame is written into scratch.
func (f wireFormat) encodeFrame(scratch *bytes.Buffer, frame []byte) ([]byte, error) {
	if f == formatJSON {
		return frame, nil
	}
	if err := jsonToMsgpack(scratch, frame); err != nil {
		return nil, err
	}
	return scratch.Bytes(), nil
}

// jsonToMsgpack converts one JSON value to msgpack. Object keys come out
// sorted; integers that fit 64 bits stay integers, and every other number
// becomes the nearest float64.
func jsonToMsgpack(w *bytes.Buffer, data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("frame is not JSON: %w", err)
	}
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(w)
	return encodeMsgpack(enc, v)
}

func encodeMsgpack(enc *msgpack.Encoder, v any) error {
	switch v := v.(type) {
	case nil:
		return enc.EncodeNil()
	case bool:
		return enc.EncodeBool(v)
	case string:
		return enc.EncodeString(v)
	case json.Number:
		if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return enc.EncodeInt(n)
		}
		if n, err := strconv.ParseUint(string(v), 10, 64); err == nil {
			return enc.EncodeUint(n)
		}
		// Out of range gives ±Inf or 0, the nearest float64 there is.
		n, _ := strconv.ParseFloat(string(v), 64)
		return enc.EncodeFloat64(n)
	case []any:
		if err := enc.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for _, e := range v {
			if err := encodeMsgpack(enc, e); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if err := enc.EncodeMapLen(len(v)); err != nil {
			return err
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if err := enc.EncodeString(k); err != nil {
				return err
			}
			if err := encodeMsgpack(enc, v[k]); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unexpected JSON value of type %T", v)
}

// msgpackToJSON converts one msgpack value to JSON. Map keys must be
// strings; binary becomes a base64 string, as encoding/json renders
// []byte, and a msgpack timestamp an RFC 3339 string. Other extension
// types, NaN and infinities have no JSON form and are refused.
//
// The decoder is written out rather than taken from the msgpack library:
// a client controls every length prefix, and each one is checked against
// the bytes actually present before anything is allocated.
func msgpackToJSON(data []byte) ([]byte, error) {
	r := mpReader{b: data}
	out, err := r.value(make([]byte, 0, len(data)+len(data)/2+16), 0)
	if err != nil {
		return nil, err
	}
	if r.i != len(r.b) {
		return nil, fmt.Errorf("msgpack: %d bytes after the frame", len(r.b)-r.i)
	}
	return out, nil
}

var errTruncated = errors.New("msgpack: truncated")

// mpReader reads msgpack from a byte slice.
type mpReader struct {
	b []byte
	i int
}

func (r *mpReader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.i {
		return nil, errTruncated
	}
	p := r.b[r.i : r.i+n]
	r.i += n
	return p, nil
}

// uint reads a big-endian unsigned integer of size bytes.
func (r *mpReader) uint(size int) (uint64, error) {
	p, err := r.take(size)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range p {
		n = n<<8 | uint64(c)
	}
	return n, nil
}

// length reads a length prefix of size bytes; each of the n items that
// follow takes at least per bytes, which bounds n by what is left.
func (r *mpReader) length(size, per int) (int, error) {
	n, err := r.uint(size)
	if err != nil {
		return 0, err
	}
	if n > uint64(len(r.b)-r.i)/uint64(per) {
		return 0, errTruncated
	}
	return int(n), nil
}

// lengthBytes is how many bytes a str/bin/ext length prefix of code c takes,
// by its offset from the 8-bit variant.
func lengthBytes(c, first byte) int { return 1 << (c - first) }

func (r *mpReader) value(out []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, errors.New("msgpack: nested too deep")
	}
	c, err := r.uint(1)
	if err != nil {
		return nil, err
	}
	code := byte(c)
	switch {
	case code <= 0x7f:
		return strconv.AppendUint(out, c, 10), nil
	case code >= 0xe0:
		return strconv.AppendInt(out, int64(int8(code)), 10), nil
	case code >= 0x80 && code <= 0x8f:
		return r.mapBody(out, int(code&0x0f), depth)
	case code >= 0x90 && code <= 0x9f:
		return r.arrayBody(out, int(code&0x0f), depth)
	case code >= 0xa0 && code <= 0xbf:
		return r.str(out, int(code&0x1f))
	}
	switch code {
	case 0xc0:
		return append(out, "null"...), nil
	case 0xc2:
		return append(out, "false"...), nil
	case 0xc3:
		return append(out, "true"...), nil
	case 0xc4, 0xc5, 0xc6:
		n, err := r.length(lengthBytes(code, 0xc4), 1)
		if err != nil {
			return nil, err
		}
		p, _ := r.take(n)
		out = append(out, '"')
		out = base64.StdEncoding.AppendEncode(out, p)
		return append(out, '"'), nil
	case 0xc7, 0xc8, 0xc9:
		n, err := r.length(lengthBytes(code, 0xc7), 1)
		if err != nil {
			return nil, err
		}
		return r.ext(out, n)
	case 0xca:
		n, err := r.uint(4)
		if err != nil {
			return nil, err
		}
		return appendFloat(out, float64(math.Float32frombits(uint32(n))), 32)
	case 0xcb:
		n, err := r.uint(8)
		if err != nil {
			return nil, err
		}
		return appendFloat(out, math.Float64frombits(n), 64)
	case 0xcc, 0xcd, 0xce, 0xcf:
		n, err := r.uint(1 << (code - 0xcc))
		if err != nil {
			return nil, err
		}
		return strconv.AppendUint(out, n, 10), nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		size := 1 << (code - 0xd0)
		n, err := r.uint(size)
		if err != nil {
			return nil, err
		}
		// Sign-extend from size bytes.
		shift := 64 - 8*size
		return strconv.AppendInt(out, int64(n<<shift)>>shift, 10), nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return r.ext(out, 1<<(code-0xd4))
	case 0xd9, 0xda, 0xdb:
		n, err := r.length(lengthBytes(code, 0xd9), 1)
		if err != nil {
			return nil, err
		}
		return r.str(out, n)
	case 0xdc, 0xdd:
		n, err := r.length(2<<(code-0xdc), 1)
		if err != nil {
			return nil, err
		}
		return r.arrayBody(out, n, depth)
	case 0xde, 0xdf:
		n, err := r.length(2<<(code-0xde), 2)
		if err != nil {
			return nil, err
		}
		return r.mapBody(out, n, depth)
	}
	return nil, fmt.Errorf("msgpack: invalid code 0x%02x", code)
}

func (r *mpReader) str(out []byte, n int) ([]byte, error) {
	p, err := r.take(n)
	if err != nil {
		return nil, err
	}
	// appendJSONString would make bad bytes U+FFFD without a word.
	if !utf8.Valid(p) {
		return nil, errors.New("msgpack: a string is not valid UTF-8")
	}
	return event.AppendJSONString(out, string(p)), nil
}

func (r *mpReader) arrayBody(out []byte, n, depth int) ([]byte, error) {
	out = append(out, '[')
	for i := range n {
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if out, err = r.value(out, depth+1); err != nil {
			return nil, err
		}
	}
	return append(out, ']'), nil
}

func (r *mpReader) mapBody(out []byte, n, depth int) ([]byte, error) {
	out = append(out, '{')
	for i := range n {
		if i > 0 {
			out = append(out, ',')
		}
		c, err := r.uint(1)
		if err != nil {
			return nil, err
		}
		var klen int
		switch code := byte(c); {
		case code >= 0xa0 && code <= 0xbf:
			klen = int(code & 0x1f)
		case code == 0xd9 || code == 0xda || code == 0xdb:
			if klen, err = r.length(lengthBytes(code, 0xd9), 1); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("msgpack: map key of code 0x%02x; keys must be strings", code)
		}
		if out, err = r.str(out, klen); err != nil {
			return nil, err
		}
		out = append(out, ':')
		if out, err = r.value(out, depth+1); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

// timestampExt is the msgpack extension type of timestamps.
const timestampExt = -1

// ext converts an extension of n data bytes; only timestamps have a JSON form.
func (r *mpReader) ext(out []byte, n int) ([]byte, error) {
	typ, err := r.uint(1)
	if err != nil {
		return nil, err
	}
	p, err := r.take(n)
	if err != nil {
		return nil, err
	}
	if int8(typ) != timestampExt {
		return nil, fmt.Errorf("msgpack: extension type %d has no JSON form", int8(typ))
	}
	var sec, nsec int64
	switch n {
	case 4:
		sec = int64(binary.BigEndian.Uint32(p))
	case 8:
		v := binary.BigEndian.Uint64(p)
		nsec, sec = int64(v>>34), int64(v&(1<<34-1))
	case 12:
		nsec, sec = int64(binary.BigEndian.Uint32(p)), int64(binary.BigEndian.Uint64(p[4:]))
	default:
		return nil, fmt.Errorf("msgpack: timestamp of %d bytes", n)
	}
	if nsec >= 1e9 {
		return nil, errors.New("msgpack: timestamp nanoseconds out of range")
	}
	return event.AppendJSONString(out, time.Unix(sec, nsec).UTC().Format(time.RFC3339Nano)), nil
}

// appendFloat formats f as encoding/json does.
func appendFloat(out []byte, f float64, bits int) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, errors.New("msgpack: NaN and infinities have no JSON form")
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	out = strconv.AppendFloat(out, f, format, -1, bits)
	if format == 'e' {
		// Shorten e-09 to e-9, as encoding/json does.
		if n := len(out); n >= 4 && out[n-4] == 'e' && out[n-3] == '-' && out[n-2] == '0' {
			out[n-2] = out[n-1]
			out = out[:n-1]
		}
	}
	return out, nil
}
