package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The write side of an accepted connection (perIPConn) serves the answers
// and streams written on it in two ways, both on the goroutine that writes:
//
//   - Work that must follow an answer, the pushes it caused, runs right
//     after the write that carries the answer's last bytes (afterWrite):
//     no goroutine is started for it, and it cannot overtake the answer.
//   - The last frames of an SSE response are held back and leave in one
//     write with the end of its chunked body (holdToEnd, endHeld). fasthttp
//     flushes each chunk, the terminating chunk and the response's end
//     apart: three system calls where one does.
//
// Neither costs anything while unused: Write checks one atomic word.
type writeSide struct {
	// flags says that Write must take the slow path: something is held or
	// waits for the next write.
	flags atomic.Uint32

	mu   sync.Mutex
	held []byte // bytes held back while holding
	// holding: writes are held back until the response ends; ending: it
	// has ended, and the next write carries what is held.
	holding, ending bool
	then            []func() // to run after the next write
	closed          bool     // the connection is closed: what comes runs at once
}

const (
	flagHolding uint32 = 1 << iota
	flagThen
)

// maxHeld bounds what a connection holds back: past it, the held bytes
// leave at once, and holding goes on. A stream's last flush is what its
// transport buffered: at most 64 KiB past one frame (stream.SSE).
const maxHeld = 64 << 10

// setFlags recomputes flags; the caller holds w.mu.
func (w *writeSide) setFlags() {
	var f uint32
	if w.holding {
		f |= flagHolding
	}
	if len(w.then) > 0 {
		f |= flagThen
	}
	w.flags.Store(f)
}

// write writes p to conn, holding it back while a response's end is
// awaited, and then runs what waited for it.
func (w *writeSide) write(conn net.Conn, p []byte) (int, error) {
	if w.flags.Load() == 0 {
		return conn.Write(p)
	}
	w.mu.Lock()
	if !w.holding {
		w.mu.Unlock()
		n, err := conn.Write(p)
		w.runThen()
		return n, err
	}
	if !w.ending && len(w.held)+len(p) <= maxHeld {
		w.held = append(w.held, p...)
		w.mu.Unlock()
		return len(p), nil
	}
	// The held bytes leave now, before p and in the same write.
	ended := w.ending
	buf := append(w.held, p...)
	before := len(w.held)
	w.held = nil
	if ended {
		w.holding, w.ending = false, false
		w.setFlags()
	}
	w.mu.Unlock()
	n, err := conn.Write(buf)
	if ended {
		// The deadline the stream armed for its last flush must not
		// outlive the response: the connection may carry the client's
		// next request.
		_ = conn.SetWriteDeadline(time.Time{})
		w.runThen()
	}
	return max(n-before, 0), err
}

// afterWrite makes f run right after the next write, which carries the
// last bytes of the answer being written, on the goroutine that writes it;
// or, should no write come, when the connection goes idle or is closed.
func (w *writeSide) afterWrite(f func()) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		f()
		return
	}
	w.then = append(w.then, f)
	w.setFlags()
	w.mu.Unlock()
}

// runThen runs what waited for a write.
func (w *writeSide) runThen() {
	if w.flags.Load()&flagThen == 0 {
		return
	}
	w.mu.Lock()
	then := w.then
	w.then = nil
	w.setFlags()
	w.mu.Unlock()
	for _, f := range then {
		f()
	}
}

// holdToEnd holds back what is written from now on until the response
// ends (endHeld): an SSE stream's last flush then leaves with the end of
// its chunked body. The write deadline set for that flush bounds the write
// that carries them, and is cleared after it.
func (w *writeSide) holdToEnd() {
	w.mu.Lock()
	w.holding = true
	w.setFlags()
	w.mu.Unlock()
}

// endHeld says that the response being written has ended: its last bytes
// are the next write, which carries what is held with them.
func (w *writeSide) endHeld() {
	w.mu.Lock()
	if w.holding {
		w.ending = true
	}
	w.mu.Unlock()
}

// closing is called before the connection closes: what is held leaves,
// when the response it belongs to has ended, and what waited for a write
// runs.
// holdingBack reports whether bytes wait for a response's end.
func (w *writeSide) holdingBack() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.holding
}

func (w *writeSide) closing(conn net.Conn) {
	w.mu.Lock()
	w.closed = true
	held := w.held
	send := w.holding && w.ending && len(held) > 0
	w.held, w.holding, w.ending = nil, false, false
	w.setFlags()
	w.mu.Unlock()
	if send {
		_, _ = conn.Write(held)
	}
	w.runThen()
}

// answerConn is the write side of a connection the gateway accepted
// (perIPConn), as handlers and streams reach it through ctx.Conn().
type answerConn interface {
	afterWrite(f func())
	holdToEnd()
	endHeld()
	// wentIdle runs what waited for a write that fasthttp left out: it
	// skips the flush after an answer when the client pipelined its next
	// request.
	wentIdle()
}
