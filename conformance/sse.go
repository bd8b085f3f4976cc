package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// frame is one SSE block: the lines up to a blank line. The order of the
// field names is kept because the wire facts fix it (id before event).
type frame struct {
	fields   []string // field names in order, e.g. ["id", "event", "data"]
	comments []string // comment lines, without the colon
	event    string
	data     string
	id       string
	retry    string
	hasID    bool
	hasData  bool
}

// isEvent reports whether the frame is a deliverable event: clients act
// only on frames with both an event and a data line.
func (f frame) isEvent() bool { return f.event != "" && f.hasData }

// isComment reports whether the frame holds only comments (heartbeats).
func (f frame) isComment() bool { return len(f.fields) == 0 && len(f.comments) > 0 }

// json decodes the frame's data as a JSON object; nil when it is not one.
func (f frame) json() obj {
	var o obj
	if json.Unmarshal([]byte(f.data), &o) != nil {
		return nil
	}
	return o
}

// parseSSE reads blocks from r until it ends, per the EventSource rules the
// wire facts describe: lines split on \n with a trailing \r dropped, one
// space after the colon dropped, data lines joined with \n, a blank line
// dispatching. An unterminated last block is discarded, as browsers do.
func parseSSE(r io.Reader, emit func(frame)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var f frame
	started := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			if started {
				emit(f)
			}
			f, started = frame{}, false
			continue
		}
		started = true
		if strings.HasPrefix(line, ":") {
			f.comments = append(f.comments, line[1:])
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		f.fields = append(f.fields, name)
		switch name {
		case "event":
			f.event = strings.TrimSpace(value)
		case "data":
			if f.hasData {
				f.data += "\n"
			}
			f.data += value
			f.hasData = true
		case "id":
			f.id, f.hasID = value, true
		case "retry":
			f.retry = value
		}
	}
}

// stream is an open SSE response read in the background. Frames are kept
// in arrival order; waiting for one takes the first unused frame that
// matches, so frames of other kinds stay available to later waits.
type stream struct {
	path   string
	header http.Header
	cancel context.CancelFunc

	mu     sync.Mutex
	frames []frame
	used   []bool
	ended  bool
	err    error
	wake   chan struct{} // closed and replaced whenever something arrives
}

// openStream opens an SSE stream. When the server answers with anything but
// a 200 event stream, it returns nil and the read answer instead.
func (t *tc) openStream(path string, opts ...reqOpt) (*stream, *response) {
	ctx, cancel := context.WithCancel(t.ctx)
	req := t.newRequest(ctx, http.MethodGet, path, nil, opts)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := t.o.HTTPClient.Do(req)
	if err != nil {
		cancel()
		t.fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		defer cancel()
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, &response{method: http.MethodGet, path: path, status: resp.StatusCode, header: resp.Header, body: data}
	}
	s := &stream{path: path, header: resp.Header, cancel: cancel, wake: make(chan struct{})}
	go func() {
		defer resp.Body.Close()
		err := parseSSE(resp.Body, s.add)
		s.mu.Lock()
		s.ended, s.err = true, err
		close(s.wake)
		s.wake = make(chan struct{})
		s.mu.Unlock()
	}()
	t.cleanup(func(context.Context) { s.close() })
	return s, &response{method: http.MethodGet, path: path, status: resp.StatusCode, header: resp.Header}
}

// mustStream opens a stream or fails the check.
func (t *tc) mustStream(path string, opts ...reqOpt) *stream {
	s, r := t.openStream(path, opts...)
	if s == nil {
		t.fatalf("want a 200 text/event-stream: %s (Content-Type %q)", r, r.header.Get("Content-Type"))
	}
	return s
}

func (s *stream) add(f frame) {
	s.mu.Lock()
	s.frames = append(s.frames, f)
	s.used = append(s.used, false)
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

// close drops the connection.
func (s *stream) close() { s.cancel() }

// poll waits for the first unused frame matching match and marks it used.
// ok is false when ctx ends first or the stream ends without one.
func (s *stream) poll(ctx context.Context, match func(frame) bool) (f frame, ok bool) {
	for {
		s.mu.Lock()
		for i := range s.frames {
			if !s.used[i] && match(s.frames[i]) {
				s.used[i] = true
				f := s.frames[i]
				s.mu.Unlock()
				return f, true
			}
		}
		ended, wake := s.ended, s.wake
		s.mu.Unlock()
		if ended {
			return frame{}, false
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return frame{}, false
		}
	}
}

// next waits for a matching frame or fails the check.
func (s *stream) next(t *tc, what string, match func(frame) bool) frame {
	f, ok := s.poll(t.ctx, match)
	if !ok {
		if s.isEnded() {
			t.fatalf("%s: stream ended before %s", s.path, what)
		}
		t.fatalf("%s: timed out waiting for %s", s.path, what)
	}
	return f
}

// nextEvent waits for an event frame of the type whose data is a JSON
// object satisfying match (nil matches any).
func (s *stream) nextEvent(t *tc, typ string, match func(obj) bool) (frame, obj) {
	var data obj
	f := s.next(t, typ, func(f frame) bool {
		if f.event != typ || !f.hasData {
			return false
		}
		o := f.json()
		if o == nil || (match != nil && !match(o)) {
			return false
		}
		data = o
		return true
	})
	return f, data
}

// absent fails the check if a matching frame arrives within d.
func (s *stream) absent(t *tc, d time.Duration, what string, match func(frame) bool) {
	ctx, cancel := t.within(d)
	defer cancel()
	if f, ok := s.poll(ctx, match); ok {
		t.fatalf("%s: unexpected %s: event %q data %s", s.path, what, f.event, f.data)
	}
}

// started waits for the first frame of the stream; servers send the retry
// preamble once the connection is registered, so a check that acts right
// after does not race the registration. The frame stays available to
// later waits.
func (s *stream) started(t *tc) {
	for {
		s.mu.Lock()
		n, ended, wake := len(s.frames), s.ended, s.wake
		s.mu.Unlock()
		switch {
		case n > 0:
			return
		case ended:
			t.fatalf("%s: stream ended before its first frame", s.path)
		}
		select {
		case <-wake:
		case <-t.ctx.Done():
			t.fatalf("%s: timed out waiting for the first frame", s.path)
		}
	}
}

// waitEnd reports whether the server ends the stream within d.
func (s *stream) waitEnd(t *tc, d time.Duration) bool {
	ctx, cancel := t.within(d)
	defer cancel()
	for {
		s.mu.Lock()
		ended, wake := s.ended, s.wake
		s.mu.Unlock()
		if ended {
			return true
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		}
	}
}

func (s *stream) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// all returns every frame received so far.
func (s *stream) all() []frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]frame(nil), s.frames...)
}

// readAll waits for the server to end the stream and returns every frame;
// the check fails if it does not end within d.
func (s *stream) readAll(t *tc, d time.Duration) []frame {
	if !s.waitEnd(t, d) {
		t.fatalf("%s: the server did not end the stream within %s (got %d frames)", s.path, d, len(s.all()))
	}
	return s.all()
}

// events returns the event frames among frames.
func events(frames []frame) []frame {
	var out []frame
	for _, f := range frames {
		if f.isEvent() {
			out = append(out, f)
		}
	}
	return out
}
