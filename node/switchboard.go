package node

import (
	"errors"
	"net"
	"sync"
)

// switchboard accepts a member's connections on its one listener and hands
// each to the server of the member's current role: the relay while it
// follows, the node while it leads. A role change gives the next server a
// new listener (take); connections not yet accepted by the previous one
// go to the next.
type switchboard struct {
	ln    net.Listener
	conns chan net.Conn
	mu    sync.Mutex
	cur   *boardListener
	done  chan struct{}
	once  sync.Once
	ended chan struct{}
}

// boardBacklog bounds the connections accepted and not yet taken by a
// server; past it the accept loop waits, as the kernel's backlog then
// holds them.
const boardBacklog = 128

func newSwitchboard(ln net.Listener) *switchboard {
	b := &switchboard{ln: ln, conns: make(chan net.Conn, boardBacklog), done: make(chan struct{}), ended: make(chan struct{})}
	go b.accept()
	return b
}

func (b *switchboard) accept() {
	defer close(b.ended)
	for {
		c, err := b.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case b.conns <- c:
		case <-b.done:
			c.Close()
			return
		}
	}
}

// take returns a new listener for the next server and closes the current
// one's.
func (b *switchboard) take() net.Listener {
	l := &boardListener{b: b, closed: make(chan struct{})}
	b.mu.Lock()
	prev := b.cur
	b.cur = l
	b.mu.Unlock()
	if prev != nil {
		prev.Close()
	}
	return l
}

// close stops accepting and closes what was accepted and not taken.
func (b *switchboard) close() error {
	var err error
	b.once.Do(func() {
		close(b.done)
		err = b.ln.Close()
		<-b.ended
		for {
			select {
			case c := <-b.conns:
				c.Close()
				continue
			default:
			}
			break
		}
	})
	return err
}

// boardListener is one server's view of the switchboard.
type boardListener struct {
	b      *switchboard
	closed chan struct{}
	once   sync.Once
}

func (l *boardListener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-l.b.conns:
		select {
		case <-l.closed:
			// Replaced meanwhile: the connection is the next server's.
			select {
			case l.b.conns <- c:
			default:
				c.Close()
			}
			return nil, net.ErrClosed
		default:
		}
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.b.done:
		return nil, net.ErrClosed
	}
}

func (l *boardListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *boardListener) Addr() net.Addr { return l.b.ln.Addr() }
