package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// longRun drives an execution through local tools and signals to
// completion, so its log has enough events to cut at many points.
func (t *tc) longRun() (*run, []event) {
	a := t.newAgent()
	r := a.start(map[string]any{"task": "long"})
	tool := newID("conformance.tool.")
	for i := 0; i < 3; i++ {
		step := r.invoke(tool, map[string]any{"i": i}, false)
		t.expectOK(r.stepResult(step, true, map[string]any{"i": i}, ""))
	}
	t.signal(r.id, "conf.note", nil)
	r.complete(map[string]any{"done": true})
	return r, t.events(r.id)
}

func checkResumeCuts(t *tc) {
	r, evs := t.longRun()
	n := uint64(len(evs))
	for _, k := range []uint64{0, 1, 2, n / 2, n - 2, n - 1} {
		cursor := strconv.FormatUint(k, 10)
		s := t.mustStream("/v0/executions/" + r.id + "/stream?after_sequence=" + cursor)
		t.wantFrames("after_sequence="+cursor, s.readAll(t, 5*time.Second), evs, k)
		s = t.mustStream("/v0/executions/"+r.id+"/stream", header("Last-Event-ID", cursor))
		t.wantFrames("Last-Event-ID: "+cursor, s.readAll(t, 5*time.Second), evs, k)
	}
}

func checkResumeLiveCut(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	tool := newID("conformance.tool.")
	var got []frame
	var cursor string
	open := func(round int) *stream {
		path := "/v0/executions/" + r.id + "/stream"
		switch {
		case cursor == "":
			return t.mustStream(path)
		case round%2 == 0:
			return t.mustStream(path, header("Last-Event-ID", cursor))
		default:
			return t.mustStream(path + "?after_sequence=" + cursor)
		}
	}
	for round := 0; round < 4; round++ {
		s := open(round)
		step := r.invoke(tool, map[string]any{"round": round}, false)
		// Take one event, then drop the connection: frames the server wrote
		// after it count as lost, as after a real network cut.
		f := s.next(t, "a live event", frame.isEvent)
		got = append(got, f)
		cursor = f.id
		s.close()
		t.expectOK(r.stepResult(step, true, map[string]any{"round": round}, ""))
		t.signal(r.id, "conf.cut", map[string]any{"round": round})
	}
	s := open(4)
	r.complete(nil)
	got = append(got, s.readAll(t, 5*time.Second)...)
	t.wantFrames("events across 5 connections", got, t.events(r.id), 0)
}

func checkIdempotentIntent(t *tc) {
	a := t.newAgent()
	r := a.start(nil)
	tool := newID("conformance.tool.")
	key := newID("idem-")
	in := map[string]any{"type": "invoke_tool", "tool_id": tool, "arguments": map[string]any{"a": 1}, "idempotency_key": key}
	first := r.intent(in)
	t.needAllowed(tool, first)
	o1 := t.expectJSON(first, http.StatusOK)
	s1 := t.wantStr(o1, "step_id", "keyed invoke_tool")
	again := r.intent(in)
	t.expect(again, http.StatusOK)
	if !sameJSON(again.body, first.body) {
		t.fatalf("a retried keyed intent answered %s, the first answer was %s", again.body, first.body)
	}
	evs := t.events(r.id)
	if n := len(ofType(evs, "step.created", "")); n != 1 {
		t.fatalf("two intents with key %s created %d steps, want 1", key, n)
	}
	if e := t.one(evs, "step.created", s1); e.IdempotencyKey != key {
		t.fatalf("step.created of a keyed intent has idempotency_key %q, want %q (wire-facts §14.1)", e.IdempotencyKey, key)
	}
	t.expectError(r.intent(map[string]any{"type": "invoke_tool", "tool_id": tool, "arguments": map[string]any{"a": 2}, "idempotency_key": key}), http.StatusConflict, "CONFLICT")

	hkey := newID("idem-h-")
	hin := map[string]any{"type": "invoke_tool", "tool_id": tool}
	o2 := t.expectJSON(r.intent(hin, header("Idempotency-Key", hkey)), http.StatusOK)
	s2 := t.wantStr(o2, "step_id", "invoke_tool keyed by header")
	o3 := t.expectJSON(r.intent(hin, header("Idempotency-Key", hkey)), http.StatusOK)
	t.wantEq("step_id of a retry keyed by the Idempotency-Key header", t.wantStr(o3, "step_id", "retry"), s2)
	if n := len(ofType(t.events(r.id), "step.created", "")); n != 2 {
		t.fatalf("after two keyed pairs of intents: %d steps, want 2", n)
	}
	t.expectOK(r.stepResult(s1, true, nil, ""))
	t.expectOK(r.stepResult(s2, true, nil, ""))

	ckey := newID("idem-c-")
	done := map[string]any{"type": "complete", "output": map[string]any{"v": 1}, "idempotency_key": ckey}
	r.accepted(done)
	retry := r.intent(done)
	if retry.status != http.StatusOK {
		t.fatalf("a retried keyed complete after success must return the first answer, not an error: %s", retry)
	}
	if n := len(ofType(t.events(r.id), "execution.completed", "")); n != 1 {
		t.fatalf("%d execution.completed events, want 1", n)
	}
}

func checkIdempotentResults(t *tc) {
	rn, r, step := t.remoteStep(nil)
	job := rn.job(step)
	data := map[string]any{"v": 1}
	key := newID("res-")
	t.expectOK(rn.result(job, true, data, "", false, header("Idempotency-Key", key)))
	r.push("tool.result", step)
	n := len(t.events(r.id))
	for i := 0; i < 2; i++ {
		t.expectOK(rn.result(job, true, data, "", false, header("Idempotency-Key", key)))
	}
	if got := len(t.events(r.id)); got != n {
		t.fatalf("retried runner results wrote %d new events", got-n)
	}
	local := r.invoke(newID("conformance.tool."), nil, false)
	keyed := map[string]any{"execution_id": r.id, "session_id": r.session, "step_id": local, "success": true, "data": data, "idempotency_key": newID("res-l-")}
	t.expectOK(t.call(http.MethodPost, "/v0/agents/step-result", keyed))
	r.push("tool.result", local)
	n = len(t.events(r.id))
	t.expectOK(t.call(http.MethodPost, "/v0/agents/step-result", keyed))
	if got := len(t.events(r.id)); got != n {
		t.fatalf("a retried keyed step-result wrote %d new events", got-n)
	}
	r.a.s.absent(t, 500*time.Millisecond, "a second tool.result push after retried results", func(f frame) bool {
		return f.event == "tool.result"
	})
	r.complete(nil)
}

// peerCursors starts an execution on a fresh agent and skips the check
// unless agent-stream deliveries carry an id: line, the sequence of the
// consumer's outbox that a reconnect names as its cursor.
func (t *tc) peerCursors() (*agent, *run, frame) {
	a := t.newAgent()
	r := a.start(nil)
	for _, f := range a.s.all() {
		if f.event == "execution.assigned" {
			if id, _ := f.json().str("execution_id"); id == r.id {
				if !f.hasID {
					t.skipf("not built: agent-stream deliveries carry no id: sequence, so a consumer cannot name a cursor (durable per-peer outbox with acks)")
				}
				return a, r, f
			}
		}
	}
	t.fatalf("execution.assigned frame not found")
	return nil, nil, frame{}
}

// laterID reports whether delivery id b comes after id a. Ids are numbers
// or "<epoch>.<sequence>"; within one epoch the sequences are compared,
// anything else only by inequality.
func laterID(a, b string) bool {
	ea, sa := splitID(a)
	eb, sb := splitID(b)
	x, e1 := strconv.ParseUint(sa, 10, 64)
	y, e2 := strconv.ParseUint(sb, 10, 64)
	if ea == eb && e1 == nil && e2 == nil {
		return y > x
	}
	return a != b
}

// gapAfter reports whether delivery id next skips sequences after cursor
// in the same epoch.
func gapAfter(cursor, next string) bool {
	e1, s1 := splitID(cursor)
	e2, s2 := splitID(next)
	n1, err1 := strconv.ParseUint(s1, 10, 64)
	n2, err2 := strconv.ParseUint(s2, 10, 64)
	return e1 == e2 && err1 == nil && err2 == nil && n2 > n1+1
}

func splitID(id string) (epoch, seq string) {
	if i := strings.LastIndexByte(id, '.'); i >= 0 {
		return id[:i], id[i+1:]
	}
	return "", id
}

func checkPeerResume(t *tc) {
	a, r, assigned := t.peerCursors()
	step := r.invoke(newID("conformance.tool."), nil, false)
	a.s.close()
	t.expectOK(r.stepResult(step, true, map[string]any{"v": 1}, ""))
	t.signal(r.id, "conf.away", nil)
	a.connect(header("Last-Event-ID", assigned.id))
	res := a.s.next(t, "the missed tool.result", func(f frame) bool { return f.event == "tool.result" })
	sig := a.s.next(t, "the missed signal.received", func(f frame) bool { return f.event == "signal.received" })
	if !laterID(assigned.id, res.id) || !laterID(res.id, sig.id) {
		t.fatalf("replayed ids %q, %q do not follow the cursor %q in order", res.id, sig.id, assigned.id)
	}
	for _, f := range a.s.all() {
		if f.event == "execution.assigned" {
			t.fatalf("execution.assigned (id %s), at or before the cursor %s, was sent again", f.id, assigned.id)
		}
	}
	r.complete(nil)
}

// seqOf returns the sequence part of a delivery id.
func seqOf(t *tc, id string) uint64 {
	_, seq := splitID(id)
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		t.fatalf("delivery id %q has no numeric sequence", id)
	}
	return n
}

func checkExplicitAck(t *tc) {
	t.peerCursors()
	if t.routeMissing(http.MethodPost, "/v0/peers/ack") {
		t.skipf("not built: POST /v0/peers/ack is 404 (acknowledgements for SSE consumers)")
	}
	a := &agent{t: t, id: newID("conf-agent-"), consumer: newID("conf-consumer-"), extra: url.Values{"ack": {"explicit"}}}
	a.connect()
	r := a.start(nil)
	step := r.invoke(newID("conformance.tool."), nil, false)
	t.expectOK(r.stepResult(step, true, nil, ""))
	r.push("tool.result", step)
	isPush := func(f frame) bool { return f.event == "execution.assigned" || f.event == "tool.result" }
	var first []frame
	for _, f := range a.s.all() {
		if isPush(f) {
			first = append(first, f)
		}
	}
	if len(first) != 2 {
		t.fatalf("want execution.assigned and tool.result, got %d pushes", len(first))
	}

	a.connect()
	again := []frame{a.s.next(t, "unacknowledged execution.assigned again", isPush), a.s.next(t, "unacknowledged tool.result again", isPush)}
	for i := range first {
		if again[i].event != first[i].event || again[i].id != first[i].id {
			t.fatalf("after a reconnect without acks, delivery %d is %s %q, want %s %q again, in order", i+1, again[i].event, again[i].id, first[i].event, first[i].id)
		}
	}
	t.expectOK(t.call(http.MethodPost, "/v0/peers/ack", map[string]any{
		"role": "agent", "id": a.id, "consumer_id": a.consumer, "sequence": seqOf(t, first[1].id),
	}))
	a.connect()
	t.signal(r.id, "conf.after-ack", nil)
	sig := a.s.next(t, "signal.received after the ack", func(f frame) bool { return f.event == "signal.received" })
	for _, f := range a.s.all() {
		if isPush(f) {
			t.fatalf("acknowledged delivery %s %q was sent again", f.event, f.id)
		}
	}
	if !laterID(first[1].id, sig.id) {
		t.fatalf("new delivery id %q does not follow the acknowledged %q", sig.id, first[1].id)
	}
	r.complete(nil)
}

func checkExplicitReset(t *tc) {
	a, r, assigned := t.peerCursors()
	epoch, _ := splitID(assigned.id)
	cursors := []string{"999999999"}
	if epoch != "" {
		cursors = []string{epoch + ".999999999", "ffffffffffffffff.1"}
	}
	for _, cur := range cursors {
		a.connect(header("Last-Event-ID", cur))
		ctx, cancel := t.within(5 * time.Second)
		f, ok := a.s.poll(ctx, func(f frame) bool { return strings.Contains(f.event, "reset") })
		cancel()
		if !ok {
			t.fatalf("cursor %s (beyond the history or from another epoch) got no reset event within 5 s", cur)
		}
		p := f.json()
		if reason, _ := p.str("reason"); reason == "" {
			t.fatalf("reset event %q names no reason: %s", f.event, f.data)
		}
		if snap, _ := p.str("snapshot"); snap == "" {
			t.fatalf("reset event %q offers no snapshot to re-hydrate from: %s", f.event, f.data)
		}
	}
	r.complete(nil)
}

// rawStream is an agent stream on a socket the suite reads only when told,
// to play a consumer that stopped reading.
type rawStream struct {
	conn net.Conn
	body io.ReadCloser
}

// openRaw opens path on a fresh socket and reads only the response header
// and the first block (the preamble). The socket keeps its default buffers:
// shrinking them leaves an orphaned server socket stuck on a zero window.
func (t *tc) openRaw(path, cursor string) *rawStream {
	u, err := url.Parse(t.o.URL)
	if err != nil {
		t.fatalf("URL: %v", err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	ctx, cancel := t.within(10 * time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", host)
	if err != nil {
		t.fatalf("dial %s: %v", host, err)
	}
	if u.Scheme == "https" {
		// The roots the suite's HTTP client trusts (a private CA, say).
		cfg := &tls.Config{}
		if tr, ok := t.o.HTTPClient.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
			cfg = tr.TLSClientConfig.Clone()
		}
		cfg.ServerName = u.Hostname()
		conn = tls.Client(conn, cfg)
	}
	t.cleanup(func(context.Context) { conn.Close() })
	// Under the base URL's path, as every other request: a gateway may be
	// served below a prefix (a hub's /edge/<box>/, a proxy's).
	req := "GET " + strings.TrimSuffix(u.Path, "/") + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nAccept: text/event-stream\r\n"
	if t.o.Token != "" {
		req += "Authorization: Bearer " + t.o.Token + "\r\n"
	}
	if cursor != "" {
		req += "Last-Event-ID: " + cursor + "\r\n"
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 512), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.fatalf("raw stream %s: %v %v", path, err, resp)
	}
	var pre []byte
	buf := make([]byte, 1)
	for !strings.HasSuffix(string(pre), "\n\n") {
		if _, err := resp.Body.Read(buf); err != nil {
			t.fatalf("raw stream preamble: %v", err)
		}
		pre = append(pre, buf[0])
	}
	_ = conn.SetDeadline(time.Time{})
	return &rawStream{conn: conn, body: resp.Body}
}

// drain reads what the server sent until it closes the connection and
// returns the complete frames; the check fails if the server keeps the
// connection open.
func (r *rawStream) drain(t *tc) []frame {
	_ = r.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	data, err := io.ReadAll(r.body)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.fatalf("the server still holds the connection of a consumer that stopped reading (%d bytes were pending)", len(data))
	}
	r.conn.Close()
	var got []frame
	_ = parseSSE(bytes.NewReader(data), func(f frame) { got = append(got, f) })
	return got
}

// waitGone waits until the server stops counting consumer as online, from
// GET /v0/peers when the server has it, else for a fixed 12 s (longer than
// Gatehouse's default 10 s write timeout).
func (t *tc) waitGone(consumer string) {
	if t.routeMissing(http.MethodGet, "/v0/peers?role=agent") {
		t.sleep(12 * time.Second)
		return
	}
	for {
		p := t.findPeer("agent", func(o obj) bool { c, _ := o.str("consumer_id"); return c == consumer })
		if st, _ := p.str("state"); p != nil && st != "online" {
			return
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-t.ctx.Done():
			t.fatalf("consumer %s, which stopped reading, is still online after the flood", consumer)
		}
	}
}

// findPeer looks for a consumer in GET /v0/peers?role=role, following
// next_cursor across pages (a server that does not page answers one page
// with no cursor); nil when it is not listed.
func (t *tc) findPeer(role string, match func(obj) bool) obj {
	cursor := ""
	for range 1000 {
		r := t.call(http.MethodGet, "/v0/peers?role="+role+"&limit=1000&cursor="+url.QueryEscape(cursor), nil)
		t.expectJSON(r, http.StatusOK)
		if p := findObject(r.body, match); p != nil {
			return p
		}
		var page struct {
			Next string `json:"next_cursor"`
		}
		if json.Unmarshal(r.body, &page) != nil || page.Next == "" {
			return nil
		}
		cursor = page.Next
	}
	return nil
}

// floodTally follows the signal deliveries of a flood across connections.
type floodTally struct {
	t      *tc
	seen   map[int]bool
	cursor string // id of the last complete delivery received
	fresh  bool   // no delivery yet since the last reconnect
}

// note records a frame; a reset ends the tally (the server said
// explicitly that deliveries were dropped, which DESIGN delivery 5
// allows), a skipped sequence right after a reconnect fails the check.
func (f *floodTally) note(fr frame) (reset bool) {
	t := f.t
	if strings.Contains(fr.event, "reset") {
		return true
	}
	if !fr.isEvent() || !fr.hasID {
		return false
	}
	if f.fresh && f.cursor != "" && gapAfter(f.cursor, fr.id) {
		t.fatalf("after the server dropped a consumer that stopped reading (%d flood deliveries received), resuming with Last-Event-ID %s got %s next: the deliveries between were skipped without a reset", len(f.seen), f.cursor, fr.id)
	}
	if f.cursor != "" && !laterID(f.cursor, fr.id) && !f.fresh {
		t.fatalf("delivery %q arrived after %q: out of order or repeated", fr.id, f.cursor)
	}
	f.fresh = false
	f.cursor = fr.id
	var p struct {
		Payload struct {
			I *int `json:"i"`
		} `json:"payload"`
	}
	if fr.event == "signal.received" && json.Unmarshal([]byte(fr.data), &p) == nil && p.Payload.I != nil {
		f.seen[*p.Payload.I] = true
	}
	return false
}

func checkSlowConsumer(t *tc) {
	a, first, assigned := t.peerCursors()
	runs := []*run{first}
	for len(runs) < 8 {
		runs = append(runs, a.start(nil))
	}
	a.s.close()
	tally := &floodTally{t: t, seen: map[int]bool{}, cursor: assigned.id}
	for _, f := range a.s.all() {
		if f.isEvent() && f.hasID && laterID(tally.cursor, f.id) {
			tally.cursor = f.id
		}
	}
	const perRound = 400
	pad := strings.Repeat("x", 16<<10)
	sent := 0
	// A server that acknowledges more than reached the socket loses
	// deliveries only when the cut falls inside its buffers, so the cut is
	// repeated while time allows.
	for round := 0; round < 6; round++ {
		if deadline, ok := t.ctx.Deadline(); round > 0 && ok && time.Until(deadline) < 15*time.Second {
			break
		}
		raw := t.openRaw(a.path(), tally.cursor)
		base := sent
		t.parallel(perRound, func(i int) {
			t.signal(runs[(base+i)%len(runs)].id, "conf.flood", map[string]any{"i": base + i, "pad": pad})
		})
		sent += perRound
		t.waitGone(a.consumer)
		tally.fresh = true
		for _, f := range raw.drain(t) {
			if tally.note(f) {
				return
			}
		}
	}
	a.connect(header("Last-Event-ID", tally.cursor))
	tally.fresh = true
	for len(tally.seen) < sent {
		f := a.s.next(t, fmt.Sprintf("the rest of the flood after %q (%d of %d seen)", tally.cursor, len(tally.seen), sent), func(f frame) bool {
			return f.event == "signal.received" || strings.Contains(f.event, "reset")
		})
		if tally.note(f) {
			return
		}
	}
	for _, r := range runs {
		r.complete(nil)
	}
}

// wsDial dials a WebSocket endpoint and reports whether the route is
// missing. On success it returns the negotiated subprotocol.
func (t *tc) wsDial(path, proto string) (missing bool, negotiated string, err error) {
	ctx, cancel := t.within(10 * time.Second)
	defer cancel()
	h := http.Header{}
	if t.o.Token != "" {
		h.Set("Authorization", "Bearer "+t.o.Token)
	}
	u := "ws" + strings.TrimPrefix(t.o.URL, "http") + path
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: t.o.HTTPClient, HTTPHeader: h, Subprotocols: []string{proto}})
	if err != nil {
		// 405 means the path exists for other methods only (for example
		// DELETE /v0/runners/{id} matching /v0/runners/ws): no GET route.
		if resp != nil && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) {
			return true, "", nil
		}
		return false, "", err
	}
	defer c.Close(websocket.StatusNormalClosure, "conformance check done")
	return false, c.Subprotocol(), nil
}

func checkWebSocketTwins(t *tc) {
	id, _ := t.create(map[string]any{"agent_id": newID("conf-agent-")}).str("id")
	twins := []struct{ name, path string }{
		{"/v0/agents/ws", "/v0/agents/ws?agent_id=" + newID("conf-agent-") + "&consumer_id=" + newID("c-")},
		{"/v0/runners/ws", "/v0/runners/ws?runner_id=" + newID("conf-runner-") + "&consumer_id=" + newID("c-")},
		{"/v0/executions/{id}/ws", "/v0/executions/" + id + "/ws"},
	}
	var missing []string
	for _, tw := range twins {
		for _, proto := range []string{"gatehouse.v1.json", "gatehouse.v1.msgpack"} {
			gone, got, err := t.wsDial(tw.path, proto)
			if gone {
				missing = append(missing, tw.name)
				break
			}
			if err != nil {
				t.fatalf("WebSocket handshake on %s with %s: %v", tw.path, proto, err)
			}
			if got != proto {
				t.fatalf("WebSocket %s: negotiated subprotocol %q, want %q", tw.name, got, proto)
			}
		}
	}
	if len(missing) > 0 {
		t.skipf("not built: no WebSocket route at %s", strings.Join(missing, ", "))
	}
}

func checkDurableRestart(t *tc) {
	t.needRestart()
	a := t.newAgent()
	remote := newID("conformance.remote.")
	r := a.start(map[string]any{"k": "durable"})
	local := r.invoke(newID("conformance.tool."), map[string]any{"n": 1}, false)
	t.expectOK(r.stepResult(local, true, map[string]any{"n": 1}, ""))
	queued := r.invoke(remote, map[string]any{"x": 1}, true)
	keyed := map[string]any{"type": "invoke_tool", "tool_id": newID("conformance.tool."), "idempotency_key": newID("idem-")}
	firstAnswer := r.intent(keyed)
	t.needAllowed(keyed["tool_id"].(string), firstAnswer)
	t.expect(firstAnswer, http.StatusOK)
	keyedStep := t.wantStr(t.object(firstAnswer), "step_id", "keyed invoke_tool")
	t.signal(r.id, "conf.durable", map[string]any{"n": 1})
	otherAgent := newID("conf-agent-")
	pending, _ := t.create(map[string]any{"agent_id": otherAgent, "input": map[string]any{"p": 1}}).str("id")
	done := a.start(nil)
	done.complete(map[string]any{"ok": true})

	watch := t.mustStream("/v0/executions/" + r.id + "/stream")
	seenBefore := watch.next(t, "an event before the restart", frame.isEvent)

	ids := []string{r.id, pending, done.id}
	before := map[string][]event{}
	status := map[string]string{}
	for _, id := range ids {
		before[id] = t.events(id)
		status[id] = t.status(id)
	}
	t.restart()
	for _, id := range ids {
		after := t.events(id)
		if len(after) < len(before[id]) {
			t.fatalf("execution %s: %d events before the restart, %d after", id, len(before[id]), len(after))
		}
		for i, e := range before[id] {
			if !sameJSON(after[i].raw, e.raw) {
				t.fatalf("execution %s: event %d changed across the restart:\n before %s\n after  %s", id, e.Sequence, e.raw, after[i].raw)
			}
		}
		t.wantEq("status of "+id+" after the restart", t.status(id), status[id])
	}
	retried := r.intent(keyed)
	if retried.status != http.StatusOK || !sameJSON(retried.body, firstAnswer.body) {
		t.fatalf("a keyed intent retried after the restart answered %s, the first answer was %s", retried, firstAnswer.body)
	}
	if n := len(ofType(t.events(r.id), "step.created", keyedStep)); n != 1 {
		t.fatalf("the keyed intent retried after the restart made %d steps", n)
	}
	t.expectOK(r.stepResult(keyedStep, true, nil, ""))
	a.connect()
	rn := t.newRunner(remote)
	job := rn.job(queued)
	t.expectOK(rn.result(job, true, map[string]any{"x": 2}, "", false))
	r.push("tool.result", queued)
	r.accepted(map[string]any{"type": "wait", "signal_type": "conf.durable"})
	t.wantStatus(r.id, "running")
	r.complete(map[string]any{"after": "restart"})
	t.wantStatus(r.id, "completed")
	watch.close()
	resumed := t.mustStream("/v0/executions/"+r.id+"/stream", header("Last-Event-ID", seenBefore.id))
	after, _ := strconv.ParseUint(seenBefore.id, 10, 64)
	t.wantFrames("execution stream resumed across the restart", resumed.readAll(t, 5*time.Second), t.events(r.id), after)

	b := &agent{t: t, id: otherAgent, consumer: newID("conf-consumer-")}
	b.connect()
	_, p := b.s.nextEvent(t, "execution.assigned", func(p obj) bool { s, _ := p.str("execution_id"); return s == pending })
	t.wantJSON("input of the execution created before the restart", p["input"], map[string]any{"p": 1})
	pr := &run{a: b, id: pending, session: t.wantStr(p, "session_id", "execution.assigned")}
	pr.complete(nil)
	t.wantStatus(pending, "completed")
}

func checkOutboxRestart(t *tc) {
	a, r, assigned := t.peerCursors()
	t.needRestart()
	step := r.invoke(newID("conformance.tool."), nil, false)
	a.s.close()
	t.expectOK(r.stepResult(step, true, map[string]any{"v": 1}, ""))
	t.restart()
	a.connect(header("Last-Event-ID", assigned.id))
	r.push("tool.result", step)
	r.complete(nil)
}
