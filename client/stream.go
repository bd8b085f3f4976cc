package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gatehouse-dev/gatehouse/client/sse"
)

// errStreamIdle ends a stream that stayed silent past StreamIdleTimeout.
var errStreamIdle = errors.New("client: stream idle, no heartbeat")

// sseConn is one open SSE response.
type sseConn struct {
	gw     int // the index of the gateway it came from
	resp   *http.Response
	events *sse.Reader
	cancel context.CancelCauseFunc
	idle   *time.Timer
	fired  atomic.Bool
}

// openStream opens an SSE stream. A non-200 answer becomes an *APIError;
// lastID, when non-empty, is sent as Last-Event-ID. A gateway that cannot
// be reached moves the client to the next one.
func (c *Client) openStream(parent context.Context, path string, q url.Values, lastID string) (*sseConn, error) {
	ctx, cancel := context.WithCancelCause(parent)
	gw := c.target()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(gw, path, q), nil)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("client: GET %s: %w", path, err)
	}
	c.header(req)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	s := &sseConn{gw: gw, cancel: cancel}
	// The watchdog also covers a server that accepts the connection but
	// never answers.
	s.idle = time.AfterFunc(c.idle, func() { s.fired.Store(true); cancel(errStreamIdle) })
	resp, err := c.hc.Do(req)
	if err != nil {
		s.close()
		if s.fired.Load() {
			err = errStreamIdle
		}
		err = fmt.Errorf("client: GET %s: %w", path, err)
		if parent.Err() == nil && !untrusted(err) {
			c.failover(gw, err)
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		aerr := readAPIError(resp)
		drain(resp.Body)
		s.close()
		if unreachable(aerr.Status) {
			c.failover(gw, aerr)
		}
		return nil, aerr
	}
	s.resp = resp
	s.events = sse.NewReader(sse.ResetOnRead(resp.Body, s.idle, c.idle), maxSSELine)
	return s, nil
}

// next returns the next event, its data owned by the caller; a silent
// connection ends with errStreamIdle.
func (s *sseConn) next() (sse.Event, error) {
	ev, err := s.events.Next()
	if err != nil && s.fired.Load() {
		err = errStreamIdle
	}
	ev.Data = bytes.Clone(ev.Data)
	return ev, err
}

// maxSSELine bounds one SSE line, so a broken or hostile server cannot make
// the client buffer without limit.
const maxSSELine = 4 << 20

func (s *sseConn) close() {
	s.idle.Stop()
	s.cancel(nil)
	if s.resp != nil {
		_ = s.resp.Body.Close()
	}
}

// fatal reports whether a stream error cannot be cured by reconnecting: the
// request itself was refused, or the gateway's certificate is not trusted.
func fatal(err error) bool {
	var aerr *APIError
	if !errors.As(err, &aerr) {
		return untrusted(err)
	}
	switch aerr.Status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return true
	}
	return false
}

// untrusted reports whether err is the refusal of the gateway's TLS
// certificate (unknown authority, wrong name, expired): a setting to fix,
// which retrying would only hide.
func untrusted(err error) bool {
	var cerr *tls.CertificateVerificationError
	return errors.As(err, &cerr)
}

// StreamExecution calls fn for each event of execution id with a sequence
// greater than after, in order, until the execution's terminal event
// (execution.completed, failed or cancelled), then returns nil. After a
// disconnect it reconnects with jittered backoff and resumes from the last
// event fn saw, so fn sees every event exactly once. It returns fn's error
// unchanged if fn fails, ctx.Err() when ctx ends, an *APIError when the
// server refuses the stream (ErrNotFound for an unknown execution), and
// ErrGap if the server skipped events.
func (c *Client) StreamExecution(ctx context.Context, id string, after uint64, fn func(Event) error) error {
	path := "/v0/executions/" + url.PathEscape(id) + "/stream"
	last := after
	b := c.backoff()
	// As serveStream: one line when the stream drops, one when it is back.
	var down time.Time
	failed := 0
	opened := func() {
		if !down.IsZero() {
			c.log.Info("execution stream resumed", "execution", id, "after", last,
				"down", time.Since(down).Round(time.Millisecond), "failed_attempts", failed)
		}
		down, failed = time.Time{}, 0
	}
	for {
		progressed, done, err := c.streamOnce(ctx, path, &last, opened, fn)
		if done {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			// The server ended the stream without a terminal event: it is
			// shutting down, or after was already past the end.
			finished, ferr := c.finishedAfter(ctx, id, last)
			if ferr != nil && fatal(ferr) {
				return ferr
			}
			if finished {
				return nil
			}
		} else if fatal(err) {
			return err
		}
		if progressed {
			b.reset()
		}
		wait := b.next()
		switch {
		case !down.IsZero():
			failed++
			c.log.Debug("execution stream reconnect failed; retrying", "execution", id, "after", last, "in", wait, "err", err)
		case err == nil:
			c.log.Info("execution stream ended by the gateway; resuming", "execution", id, "after", last, "in", wait)
		default:
			c.log.Warn("execution stream lost; resuming", "execution", id, "after", last, "in", wait, "err", err)
		}
		if down.IsZero() {
			down = time.Now()
		}
		if sleep(ctx, wait) != nil {
			return ctx.Err()
		}
	}
}

// streamOnce reads one connection of an execution stream. done means
// StreamExecution must return err as is. opened is called once the stream
// is open.
func (c *Client) streamOnce(ctx context.Context, path string, last *uint64, opened func(), fn func(Event) error) (progressed, done bool, err error) {
	q := url.Values{}
	lastID := ""
	if *last > 0 {
		lastID = strconv.FormatUint(*last, 10)
		q.Set("after_sequence", lastID)
	}
	s, err := c.openStream(ctx, path, q, lastID)
	if err != nil {
		return false, false, err
	}
	defer s.close()
	opened()
	for {
		sev, err := s.next()
		if err != nil && ctx.Err() == nil {
			// The gateway went away (or ended the stream, as it does when
			// it shuts down): the next connection goes to the next one.
			c.failover(s.gw, err)
		}
		if errors.Is(err, io.EOF) {
			return progressed, false, nil
		}
		if err != nil {
			return progressed, false, fmt.Errorf("client: execution stream: %w", err)
		}
		var ev Event
		if err := json.Unmarshal(sev.Data, &ev); err != nil {
			return progressed, false, fmt.Errorf("client: execution stream: decode %s event: %w", sev.Type, err)
		}
		switch {
		case ev.Sequence <= *last:
			continue
		case ev.Sequence != *last+1:
			return progressed, true, fmt.Errorf("%w: after sequence %d came %d", ErrGap, *last, ev.Sequence)
		}
		progressed = true
		if err := fn(ev); err != nil {
			return progressed, true, err
		}
		*last = ev.Sequence
		if ev.Terminal() {
			return progressed, true, nil
		}
	}
}

// finishedAfter reports whether execution id has finished and has no event
// after sequence last: then a stream that ended quietly has nothing left to
// say (the caller resumed past the terminal event).
func (c *Client) finishedAfter(ctx context.Context, id string, last uint64) (bool, error) {
	ex, err := c.GetExecution(ctx, id)
	if err != nil || !ex.Status.Terminal() {
		return false, err
	}
	page, err := c.Events(ctx, id, last, 1)
	if err != nil {
		return false, err
	}
	return len(page.Events) == 0, nil
}
