package relay

import (
	"bytes"
	"strconv"
)

// maxAnswerHead bounds the head of an answer answers keeps to find where
// its body ends; a longer one loses track.
const maxAnswerHead = 16 << 10

// answers follows the far side's bytes on a spliced connection as far as it
// can tell where each answer ends: answers framed by Content-Length, or
// with no body (1xx, 204, 304). Any other (chunked, ended by the close, a
// switch of protocols, a head it cannot read) loses track for the rest of
// the connection, and whole is false from then on: the splice then adds no
// answer of its own, which could land inside one of the far side's.
type answers struct {
	lost   bool
	head   []byte // the head read so far of the answer under way
	remain int64  // the bytes of the answer's body still to come
}

// whole says whether the far side's bytes so far end at the end of an
// answer (or there are none).
func (a *answers) whole() bool { return !a.lost && len(a.head) == 0 && a.remain == 0 }

// feed follows p, the far side's next bytes.
func (a *answers) feed(p []byte) {
	for len(p) > 0 && !a.lost {
		if a.remain > 0 {
			k := min(a.remain, int64(len(p)))
			a.remain -= k
			p = p[k:]
			continue
		}
		from := max(0, len(a.head)-3)
		a.head = append(a.head, p...)
		i := bytes.Index(a.head[from:], []byte("\r\n\r\n"))
		if i < 0 {
			a.lost = len(a.head) > maxAnswerHead
			return
		}
		end := from + i + 4
		p = a.head[end:]
		a.remain, a.lost = bodyLength(a.head[:end])
		// p aliases head's tail: a fresh head is appended to after it.
		a.head = nil
	}
}

// bodyLength reads an answer's head and returns the length of its body, or
// lost when it cannot tell where the body ends.
func bodyLength(head []byte) (n int64, lost bool) {
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n"))
	status := bytes.Fields(lines[0])
	if len(status) < 2 || !bytes.HasPrefix(status[0], []byte("HTTP/1.")) {
		return 0, true
	}
	code, err := strconv.Atoi(string(status[1]))
	switch {
	case err != nil, code == 101:
		return 0, true
	case code < 200, code == 204, code == 304:
		return 0, false
	}
	n = -1
	for _, l := range lines[1:] {
		name, value, ok := bytes.Cut(l, []byte(":"))
		if !ok {
			return 0, true
		}
		switch {
		case bytes.EqualFold(bytes.TrimSpace(name), []byte("Transfer-Encoding")):
			return 0, true
		case bytes.EqualFold(bytes.TrimSpace(name), []byte("Content-Length")):
			v, err := strconv.ParseInt(string(bytes.TrimSpace(value)), 10, 64)
			if err != nil || v < 0 || n >= 0 && v != n {
				return 0, true
			}
			n = v
		}
	}
	if n < 0 {
		return 0, true
	}
	return n, false
}
