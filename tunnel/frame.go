package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	version = 1
	// headerLen is a frame's header: version, kind, sequence number.
	headerLen = 10
	// frameCost is the window credit a data frame costs on top of its
	// bytes, so that a window bounds queued frames as well as bytes.
	frameCost = 64
	// helloLen is an open or accept message before its inbox: version,
	// kind, window, DeadAfter in milliseconds.
	helloLen = 10
	// maxInbox bounds the inbox a peer names.
	maxInbox = 255
)

// kind is a message's kind, its second byte.
type kind byte

const (
	kindData kind = 1 + iota
	kindAck
	kindFin
	kindClose
	kindReset
	kindPing
	kindOpen
	kindAccept
	kindRefuse
)

func (k kind) String() string {
	switch k {
	case kindData:
		return "data"
	case kindAck:
		return "ack"
	case kindFin:
		return "fin"
	case kindClose:
		return "close"
	case kindReset:
		return "reset"
	case kindPing:
		return "ping"
	case kindOpen:
		return "open"
	case kindAccept:
		return "accept"
	case kindRefuse:
		return "refuse"
	}
	return fmt.Sprintf("kind %d", byte(k))
}

// frame is one parsed frame of a conn.
type frame struct {
	kind kind
	seq  uint64
	data []byte // data: the bytes, owned by the frame
	ack  uint64 // ack: the credit consumed
}

// appendFrame appends the frame of kind k, sequence number seq and body to
// dst.
func appendFrame(dst []byte, k kind, seq uint64, body []byte) []byte {
	dst = append(dst, version, byte(k))
	dst = binary.BigEndian.AppendUint64(dst, seq)
	return append(dst, body...)
}

// parseFrame parses a conn's frame; b's bytes become the data of a data
// frame.
func parseFrame(b []byte) (frame, error) {
	if len(b) < headerLen {
		return frame{}, fmt.Errorf("a frame of %d bytes, shorter than its %d-byte header", len(b), headerLen)
	}
	if b[0] != version {
		return frame{}, fmt.Errorf("a frame of version %d, want %d", b[0], version)
	}
	f := frame{kind: kind(b[1]), seq: binary.BigEndian.Uint64(b[2:headerLen])}
	body := b[headerLen:]
	switch f.kind {
	case kindData:
		if len(body) == 0 {
			return frame{}, errors.New("an empty data frame")
		}
		f.data = body
	case kindAck:
		if len(body) != 8 {
			return frame{}, fmt.Errorf("an ack frame with a %d-byte body, want 8", len(body))
		}
		f.ack = binary.BigEndian.Uint64(body)
	case kindFin, kindClose, kindReset, kindPing:
		if len(body) != 0 {
			return frame{}, fmt.Errorf("a %v frame with a %d-byte body, want none", f.kind, len(body))
		}
	default:
		return frame{}, fmt.Errorf("a frame of %v on a conn", f.kind)
	}
	return f, nil
}

// hello is one side's half of the handshake: the open a dialer sends, or
// the accept a listener answers.
type hello struct {
	window    int
	deadAfter time.Duration
	inbox     string
}

// appendHello appends the open or accept message h to dst.
func appendHello(dst []byte, k kind, h hello) []byte {
	dst = append(dst, version, byte(k))
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.window))
	dst = binary.BigEndian.AppendUint32(dst, uint32(h.deadAfter/time.Millisecond))
	return append(dst, h.inbox...)
}

// appendRefuse appends a refusal giving reason to dst.
func appendRefuse(dst []byte, reason string) []byte {
	return append(append(dst, version, byte(kindRefuse)), reason...)
}

// parseHello parses a handshake message: an open or accept gives its hello,
// a refusal its reason.
func parseHello(b []byte) (k kind, h hello, reason string, err error) {
	if len(b) < 2 {
		return 0, h, "", fmt.Errorf("a handshake of %d bytes", len(b))
	}
	if b[0] != version {
		return 0, h, "", fmt.Errorf("a handshake of version %d, want %d", b[0], version)
	}
	k = kind(b[1])
	switch k {
	case kindRefuse:
		return k, h, string(b[2:]), nil
	case kindOpen, kindAccept:
	default:
		return 0, h, "", fmt.Errorf("a handshake of %v", k)
	}
	if len(b) < helloLen {
		return 0, h, "", fmt.Errorf("an %v of %d bytes, shorter than its %d-byte header", k, len(b), helloLen)
	}
	h.window = int(binary.BigEndian.Uint32(b[2:6]))
	h.deadAfter = time.Duration(binary.BigEndian.Uint32(b[6:10])) * time.Millisecond
	h.inbox = string(b[helloLen:])
	switch {
	case h.window < minWindow || h.window > maxWindow:
		return 0, h, "", fmt.Errorf("an %v with a window of %d, outside %d to %d", k, h.window, minWindow, maxWindow)
	case h.deadAfter <= 0:
		return 0, h, "", fmt.Errorf("an %v with no DeadAfter", k)
	case !literalSubject(h.inbox):
		return 0, h, "", fmt.Errorf("an %v naming %q, not a literal subject of at most %d bytes", k, h.inbox, maxInbox)
	}
	return k, h, "", nil
}

// literalSubject reports whether s is a subject a conn may publish to:
// dot-separated non-empty tokens, no wildcard, no white space or control
// character.
func literalSubject(s string) bool {
	if s == "" || len(s) > maxInbox {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}
