package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// The power-cut cycles' load beyond executions, notes and turns: tool
// calls a runner serves (jobs), prompts a policy raises and people answer,
// and two human channels, one on a WebSocket and one on SSE, that are sent
// those prompts and acknowledge them. Each records, in the cycle's ledger,
// only what the gateway acknowledged before the cut began.

// cutPolicy has a person decide before gatehouse.sha256 runs and allows
// every other tool.
const cutPolicy = `
rules:
  - id: ask
    priority: 1
    when: {tool_id: "gatehouse.sha256"}
    then: {decision: require_approval, reason: "the power-cut test asks"}
default:
  decision: allow
`

// cutServeFlags are the serve flags of the power-cut cycles' gateway, its
// policy written to a folder of the test's.
func cutServeFlags(t *testing.T) []string {
	t.Helper()
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(cutPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	// At info level, a slow start's log says what it did.
	return []string{"--sync", "always", "--disk-budget", "512MiB", "--policy", policy, "--log-level", "info"}
}

// The two human channels of the open gateway's one person, "local".
const (
	wsChannelID, wsPeerID   = "cut-ws", "phone"
	sseChannelID, ssePeerID = "cut-sse", "tab"
)

// Delivery events of a human channel's outbox.
const (
	eventRequested = "permission.requested"
	eventResolved  = "permission.resolved"
)

// actionFact is what the gateway acknowledged about a permission prompt:
// its creation (the execution's 201), and perhaps an answer.
type actionFact struct {
	exec string
	// answer is the state an acknowledged answer settled the prompt in;
	// "" while none was acknowledged.
	answer string
}

// jobFact is a runner's result the gateway acknowledged: the step of a
// direct execution read completed.
type jobFact struct {
	step   string
	result json.RawMessage
}

// channelFact is what a human channel was sent, and what the gateway
// acknowledged of its acknowledgements.
type channelFact struct {
	epoch string
	// acked is the highest acknowledgement the gateway answered; acks
	// counts them. sent is the highest acknowledgement sent, answered or
	// not: one sent may have been persisted though its answer never came.
	acked, sent uint64
	acks        int
	// unacked holds the deliveries seen above acked. A delivery is sent
	// only once its write is durable, so each above sent must come again.
	unacked map[uint64]channelFrame
	// requested and resolved are the prompts seen forwarded and retracted,
	// also once the cut had begun: an acknowledgement of such a delivery
	// may have been persisted, and it is not sent again.
	requested, resolved map[string]bool
}

func newChannelFact() *channelFact {
	return &channelFact{unacked: map[uint64]channelFrame{}, requested: map[string]bool{}, resolved: map[string]bool{}}
}

// saw records delivery d, sent before the cut began.
func (f *channelFact) saw(d channelFrame) {
	if d.seq > f.acked {
		f.unacked[d.seq] = d
	}
}

// seen notes delivery d, whenever it was sent.
func (f *channelFact) seen(d channelFrame) {
	switch d.event {
	case eventRequested:
		f.requested[d.action] = true
	case eventResolved:
		f.resolved[d.action] = true
	}
}

// ackedTo records an acknowledgement up to seq that the gateway answered.
func (f *channelFact) ackedTo(seq uint64) {
	f.acks++
	if seq <= f.acked {
		return
	}
	f.acked = seq
	for s := range f.unacked {
		if s <= seq {
			delete(f.unacked, s)
		}
	}
}

// channelFrame is a frame of a channel's stream, on either transport.
type channelFrame struct {
	seq           uint64
	event         string
	action, exec  string
	state, door   string
	reset, closed bool
}

// actionRecord is the part of a prompt's record the test reads.
type actionRecord struct {
	ActionID    string `json:"action_id"`
	ExecutionID string `json:"execution_id"`
	State       string `json:"state"`
	Arguments   struct {
		Door string `json:"door"`
	} `json:"arguments"`
}

func parseDelivery(seq uint64, event string, data []byte) channelFrame {
	var rec actionRecord
	_ = json.Unmarshal(data, &rec)
	return channelFrame{seq: seq, event: event, action: rec.ActionID, exec: rec.ExecutionID, state: rec.State, door: rec.Arguments.Door}
}

// action returns the ledger's fact of prompt id, of execution exec, making
// it if needed. The caller holds l.mu.
func (l *cutLedger) action(id, exec string) *actionFact {
	a := l.actions[id]
	if a == nil {
		a = &actionFact{exec: exec}
		l.actions[id] = a
	}
	return a
}

// asking notes that an answer to prompt id is about to be sent, even once
// the cut has begun: it may settle the prompt without its answer coming
// back, and before the ledger holds the prompt.
func (l *cutLedger) asking(id string) {
	l.note(func() { l.asked[id] = true })
}

// note runs fn under the ledger's lock even once the cut has begun: for
// what may have happened, as opposed to what was acknowledged.
func (l *cutLedger) note(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn()
}

// startRunners starts the two runner processes of the cycles' load on the
// gateway at base, serving the tools of their jobs until ctx ends.
func startRunners(ctx context.Context, wg *sync.WaitGroup, base string) {
	for r := range 2 {
		wg.Go(func() {
			_ = runnerCmd(ctx, []string{"--url", base, "--runner-id", "cut-runner", "--consumer-id", fmt.Sprintf("cut-runner-%d", r),
				"--tools", "gatehouse.echo,gatehouse.sha256", "--log-level", "error"}, io.Discard, io.Discard)
		})
	}
}

// pause waits d, or less if ctx ends: between attempts on a gateway that
// may be gone.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// loadJobs runs direct executions of gatehouse.echo until ctx ends, each
// served by a runner, and records every one created and every step read
// completed.
func loadJobs(ctx context.Context, client, streams *http.Client, base string, l *cutLedger, name string) {
	for i := 0; ctx.Err() == nil; i++ {
		status, ex, err := post(ctx, client, base+"/v0/executions", map[string]any{
			"tool": map[string]any{"tool_id": "gatehouse.echo", "arguments": map[string]any{"text": fmt.Sprintf("%s-%d", name, i)}}})
		if err != nil || status != 201 {
			pause(ctx, 20*time.Millisecond)
			continue
		}
		id, _ := ex["id"].(string)
		l.record(func() { l.jobExecs[id] = true })
		if step, result, ok := awaitStep(ctx, streams, base, id); ok {
			l.record(func() { l.jobs[id] = jobFact{step, result} })
		}
	}
}

// awaitStep reads the stream of execution id to its end and returns the
// step that completed and its result, if the execution completed.
func awaitStep(ctx context.Context, streams *http.Client, base, id string) (step string, result json.RawMessage, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v0/executions/"+id+"/stream", nil)
	if err != nil {
		return "", nil, false
	}
	resp, err := streams.Do(req)
	if err != nil {
		return "", nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return "", nil, false
	}
	r := ssetest.NewReader(resp.Body)
	for {
		f, err := r.Next()
		if err != nil {
			return "", nil, false
		}
		var ev struct {
			Type    string `json:"type"`
			StepID  string `json:"step_id"`
			Payload struct {
				Result json.RawMessage `json:"result"`
			} `json:"payload"`
		}
		if json.Unmarshal([]byte(f.Data), &ev) != nil {
			return "", nil, false
		}
		switch ev.Type {
		case "step.completed":
			step, result = ev.StepID, ev.Payload.Result
		case "execution.completed":
			return step, result, step != ""
		case "execution.failed", "execution.cancelled":
			return "", nil, false
		}
	}
}

// loadPrompts runs direct executions of gatehouse.sha256 until ctx ends,
// each blocked on a prompt, and records each prompt. A third are answered
// here, over HTTP, allowed or denied in turn; a third are for the
// WebSocket channel to answer; a third stay pending.
func loadPrompts(ctx context.Context, client, streams *http.Client, base string, l *cutLedger, name string) {
	doors := [...]string{"http", "ws", "none"}
	for i := 0; ctx.Err() == nil; i++ {
		door := doors[i%len(doors)]
		status, ex, err := post(ctx, client, base+"/v0/executions", map[string]any{
			"tool": map[string]any{"tool_id": "gatehouse.sha256", "arguments": map[string]any{"text": fmt.Sprintf("%s-%d", name, i), "door": door}}})
		if err != nil || status != 201 {
			pause(ctx, 20*time.Millisecond)
			continue
		}
		id, _ := ex["id"].(string)
		aid := promptOf(ctx, client, base, id)
		if aid == "" {
			continue
		}
		l.record(func() { l.action(aid, id) })
		if door != "http" {
			continue
		}
		decision := "allow_once"
		if i/len(doors)%2 == 1 {
			decision = "deny"
		}
		l.asking(aid)
		status, out, err := post(ctx, client, base+"/v0/actions/"+aid+"/respond", map[string]any{"decision": decision})
		if err != nil || status != 200 {
			continue
		}
		state, _ := out["state"].(string)
		l.record(func() { l.action(aid, id).answer = state })
		if state == "approved" {
			if step, result, ok := awaitStep(ctx, streams, base, id); ok {
				l.record(func() { l.jobs[id] = jobFact{step, result} })
			}
		}
	}
}

// promptOf returns the prompt execution id is blocked on, from its events.
func promptOf(ctx context.Context, client *http.Client, base, id string) string {
	evs, _, err := executionEvents(ctx, client, base, id)
	if err != nil {
		return ""
	}
	for _, e := range evs {
		if e.Type == "step.approval_required" {
			return e.ActionID
		}
	}
	return ""
}

// storedEvent is the part of an execution's event the test reads.
type storedEvent struct {
	Type     string `json:"type"`
	Sequence int    `json:"sequence"`
	StepID   string `json:"step_id"`
	ActionID string `json:"action_id"`
	Payload  struct {
		Result json.RawMessage `json:"result"`
	} `json:"payload"`
}

// executionEvents returns the first 1,000 events of execution id, and the
// status of the answer.
func executionEvents(ctx context.Context, client *http.Client, base, id string) ([]storedEvent, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v0/executions/"+id+"/events?limit=1000", nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var page struct {
		Events []storedEvent `json:"events"`
	}
	if resp.StatusCode != 200 {
		return nil, resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, resp.StatusCode, err
	}
	return page.Events, resp.StatusCode, nil
}

// registerChannels registers the two human channels, so that every prompt
// raised after it is forwarded to both.
func registerChannels(t *testing.T, streams *http.Client, base string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, err := dialChannel(ctx, base, "")
	if err != nil {
		t.Fatal(err)
	}
	ws.c.CloseNow()
	resp, err := openSSEChannel(ctx, streams, base, "")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// wsChannel is a connection of the WebSocket channel.
type wsChannel struct {
	c     *websocket.Conn
	epoch string
}

// dialChannel connects the WebSocket channel, resuming after cursor
// ("<epoch>.<seq>") unless it is empty, and reads its hello.
func dialChannel(ctx context.Context, base, cursor string) (*wsChannel, error) {
	u := "ws" + strings.TrimPrefix(base, "http") + "/v0/channels/ws?channel_id=" + wsChannelID + "&peer_id=" + wsPeerID
	if cursor != "" {
		u += "&cursor=" + cursor
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{gateway.SubprotocolJSON}})
	if err != nil {
		return nil, err
	}
	var hello struct {
		Type, Epoch string
	}
	_, data, err := c.Read(ctx)
	if err == nil {
		err = json.Unmarshal(data, &hello)
	}
	if err != nil || hello.Type != "hello" {
		c.CloseNow()
		return nil, fmt.Errorf("channel socket: hello %q: %v", data, err)
	}
	return &wsChannel{c: c, epoch: hello.Epoch}, nil
}

// wsFrameIn is a server frame of the channel socket.
type wsFrameIn struct {
	Type   string          `json:"type"`
	Seq    uint64          `json:"seq"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	ID     string          `json:"id"`
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

func (w *wsChannel) send(ctx context.Context, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return w.c.Write(ctx, websocket.MessageText, data)
}

// loadWSChannel runs the WebSocket channel until ctx ends, a connection at
// a time, each resuming from the last acknowledgement answered and ending
// after a few deliveries. It acknowledges each delivery with an ack frame
// that asks for a reply, and answers the prompts meant for it, allowing
// them.
func loadWSChannel(ctx context.Context, t *testing.T, base string, l *cutLedger, rng *rand.Rand) {
	f := l.channels[wsChannelID]
	for ctx.Err() == nil {
		if err := runWSChannel(ctx, base, l, f, 3+rng.IntN(15)); err != nil && ctx.Err() == nil {
			if errors.Is(err, errReset) {
				t.Errorf("WebSocket channel: %v", err)
			}
			pause(ctx, 20*time.Millisecond)
		}
	}
}

// errReset: a channel was told it cannot resume where it asked.
var errReset = errors.New("stream reset")

func runWSChannel(ctx context.Context, base string, l *cutLedger, f *channelFact, n int) error {
	var cursor string
	l.note(func() {
		if f.acked > 0 {
			cursor = f.epoch + "." + strconv.FormatUint(f.acked, 10)
		}
	})
	w, err := dialChannel(ctx, base, cursor)
	if err != nil {
		return err
	}
	defer w.c.CloseNow()
	l.record(func() { f.epoch = w.epoch })
	last := ""
	for seen := 0; ; {
		_, data, err := w.c.Read(ctx)
		if err != nil {
			return err
		}
		var fr wsFrameIn
		if err := json.Unmarshal(data, &fr); err != nil {
			return err
		}
		switch fr.Type {
		case "reset":
			return fmt.Errorf("%w: %s", errReset, fr.Data)
		case "delivery":
			d := parseDelivery(fr.Seq, fr.Event, fr.Data)
			l.note(func() { f.seen(d) })
			l.record(func() {
				f.saw(d)
				if d.event == eventRequested {
					l.action(d.action, d.exec)
				}
			})
			if d.event == eventRequested && d.state == "pending" && d.door == "ws" {
				l.asking(d.action)
				if err := w.send(ctx, map[string]any{"type": "command", "id": "r:" + d.action, "command": "respond",
					"body": map[string]any{"action_id": d.action, "decision": "allow_once"}}); err != nil {
					return err
				}
			}
			id := "a:" + strconv.FormatUint(fr.Seq, 10)
			l.note(func() { f.sent = max(f.sent, fr.Seq) })
			if err := w.send(ctx, map[string]any{"type": "ack", "seq": fr.Seq, "id": id}); err != nil {
				return err
			}
			if seen++; seen == n {
				last = id
			}
		case "reply":
			if fr.Status != 200 {
				continue
			}
			if seq, ok := strings.CutPrefix(fr.ID, "a:"); ok {
				n, _ := strconv.ParseUint(seq, 10, 64)
				l.record(func() { f.ackedTo(n) })
				if fr.ID == last {
					return nil
				}
			} else if aid, ok := strings.CutPrefix(fr.ID, "r:"); ok {
				var rec actionRecord
				_ = json.Unmarshal(fr.Body, &rec)
				l.record(func() { l.action(aid, rec.ExecutionID).answer = rec.State })
			}
		}
	}
}

// openSSEChannel opens the SSE channel's stream with explicit
// acknowledgements, resuming after cursor unless it is empty.
func openSSEChannel(ctx context.Context, streams *http.Client, base, cursor string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v0/channels/stream?channel_id="+sseChannelID+"&peer_id="+ssePeerID+"&ack=explicit", nil)
	if err != nil {
		return nil, err
	}
	if cursor != "" {
		req.Header.Set("Last-Event-ID", cursor)
	}
	resp, err := streams.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("channel stream: %d %s", resp.StatusCode, body)
	}
	return resp, nil
}

// sseFrame reads an SSE frame of a channel's stream.
func sseFrame(f ssetest.Frame) (channelFrame, string) {
	if f.Event == "stream.reset" {
		return channelFrame{reset: true}, ""
	}
	epoch, seq, _ := strings.Cut(f.ID, ".")
	n, _ := strconv.ParseUint(seq, 10, 64)
	return parseDelivery(n, f.Event, []byte(f.Data)), epoch
}

// loadSSEChannel runs the SSE channel until ctx ends, a connection at a
// time, each resuming with Last-Event-ID from the last acknowledgement
// answered and ending after a few deliveries, each acknowledged with POST
// /v0/peers/ack.
func loadSSEChannel(ctx context.Context, t *testing.T, client, streams *http.Client, base string, l *cutLedger, rng *rand.Rand) {
	f := l.channels[sseChannelID]
	for ctx.Err() == nil {
		if err := runSSEChannel(ctx, client, streams, base, l, f, 3+rng.IntN(15)); err != nil && ctx.Err() == nil {
			if errors.Is(err, errReset) {
				t.Errorf("SSE channel: %v", err)
			}
			pause(ctx, 20*time.Millisecond)
		}
	}
}

func runSSEChannel(ctx context.Context, client, streams *http.Client, base string, l *cutLedger, f *channelFact, n int) error {
	var cursor string
	l.note(func() {
		if f.acked > 0 {
			cursor = f.epoch + "." + strconv.FormatUint(f.acked, 10)
		}
	})
	resp, err := openSSEChannel(ctx, streams, base, cursor)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	r := ssetest.NewReader(resp.Body)
	for range n {
		fr, err := r.Next()
		if err != nil {
			return err
		}
		d, epoch := sseFrame(fr)
		if d.reset {
			return fmt.Errorf("%w: %s", errReset, fr.Data)
		}
		l.note(func() { f.seen(d) })
		l.record(func() {
			f.epoch = epoch
			f.saw(d)
			if d.event == eventRequested {
				l.action(d.action, d.exec)
			}
		})
		l.note(func() { f.sent = max(f.sent, d.seq) })
		status, _, err := post(ctx, client, base+"/v0/peers/ack", map[string]any{
			"role": "channel", "id": sseChannelID, "consumer_id": ssePeerID, "sequence": d.seq})
		if err != nil {
			return err
		}
		if status == 200 {
			l.record(func() { f.ackedTo(d.seq) })
		}
	}
	return nil
}

// checkFacts checks, on the gateway at base, every prompt, answer, job
// and channel acknowledgement in the ledger, counting the lost and the
// corrupted.
func checkFacts(t *testing.T, client, streams *http.Client, base string, l *cutLedger, fig *cutFigures) {
	t.Helper()
	ctx := context.Background()
	states := map[string]string{}
	fig.answered, fig.pending = 0, 0
	for aid, a := range l.actions {
		status, rec, err := send(ctx, client, http.MethodGet, base+"/v0/actions/"+aid, nil)
		if err != nil {
			t.Fatal(err)
		}
		state, _ := rec["state"].(string)
		switch {
		case status == 404:
			fig.lost++
			xs, ex, _ := send(ctx, client, http.MethodGet, base+"/v0/executions/"+a.exec, nil)
			evs, _, _ := executionEvents(ctx, client, base, a.exec)
			t.Errorf("prompt %s, acknowledged, is gone; its execution %s: %d %v, events %+v", aid, a.exec, xs, ex, evs)
			continue
		case status != 200 || state == "":
			fig.corrupted++
			t.Errorf("prompt %s: %d %v", aid, status, rec)
			continue
		}
		states[aid] = state
		if a.answer == "" {
			fig.pending++
			if !l.asked[aid] && state != "pending" {
				fig.corrupted++
				t.Errorf("prompt %s, never answered, is %s", aid, state)
			}
			continue
		}
		fig.answered++
		if state != a.answer {
			fig.lost++
			t.Errorf("prompt %s, answered %s, is %s", aid, a.answer, state)
		}
		evs, _, err := executionEvents(ctx, client, base, a.exec)
		if err != nil {
			t.Fatal(err)
		}
		resolved := 0
		for _, e := range evs {
			if e.Type == "permission.resolved" && e.ActionID == aid {
				resolved++
			}
		}
		if resolved != 1 {
			fig.lost++
			t.Errorf("prompt %s, answered: %d permission.resolved events in execution %s", aid, resolved, a.exec)
		}
	}
	for id, j := range l.jobs {
		status, ex, err := send(ctx, client, http.MethodGet, base+"/v0/executions/"+id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if status != 200 || ex["status"] != "completed" || !jsonEqual(ex["output"], j.result) {
			fig.lost++
			t.Errorf("execution %s, its step %s read completed with %s: %d %v", id, j.step, j.result, status, ex)
			continue
		}
		evs, _, err := executionEvents(ctx, client, base, id)
		if err != nil {
			t.Fatal(err)
		}
		var completed []storedEvent
		for _, e := range evs {
			if e.Type == "step.completed" {
				completed = append(completed, e)
			}
		}
		if len(completed) != 1 || completed[0].StepID != j.step || !jsonEqual(completed[0].Payload.Result, j.result) {
			fig.corrupted++
			t.Errorf("execution %s: step %s completed with %s; its step.completed events: %+v", id, j.step, j.result, completed)
		}
	}
	fig.jobs = len(l.jobs)
	ws := l.channels[wsChannelID]
	w, err := dialChannel(ctx, base, "")
	if err != nil {
		t.Fatal(err)
	}
	frames := make(chan channelFrame, 64)
	go func() {
		defer close(frames)
		for {
			_, data, err := w.c.Read(ctx)
			if err != nil {
				return
			}
			var fr wsFrameIn
			if json.Unmarshal(data, &fr) != nil {
				return
			}
			switch fr.Type {
			case "reset":
				frames <- channelFrame{reset: true}
			case "delivery":
				frames <- parseDelivery(fr.Seq, fr.Event, fr.Data)
			}
		}
	}()
	checkChannel(t, "WebSocket", ws, frames, states, fig)
	w.c.CloseNow()
	for range frames {
	}

	sctx, cancel := context.WithCancel(ctx)
	resp, err := openSSEChannel(sctx, streams, base, "")
	if err != nil {
		t.Fatal(err)
	}
	frames = make(chan channelFrame, 64)
	go func() {
		defer close(frames)
		for f := range ssetest.Stream(resp.Body, 64) {
			d, _ := sseFrame(f)
			frames <- d
		}
	}()
	checkChannel(t, "SSE", l.channels[sseChannelID], frames, states, fig)
	cancel()
	resp.Body.Close()
	for range frames {
	}
	fig.peerAcks = ws.acks + l.channels[sseChannelID].acks
}

// checkChannel checks what a channel, just connected without a cursor,
// is sent: nothing it had acknowledged, and everything it is owed: every
// delivery it was sent and did not try to acknowledge, every prompt still
// pending (states holds each prompt's state now), and the retraction of
// every prompt settled now, which goes to every channel of its owner.
func checkChannel(t *testing.T, name string, f *channelFact, frames <-chan channelFrame, states map[string]string, fig *cutFigures) {
	t.Helper()
	seqs := map[uint64]channelFrame{}
	for s, d := range f.unacked {
		if s > f.sent {
			seqs[s] = d
		}
	}
	requested, resolved := map[string]bool{}, map[string]bool{}
	for aid, state := range states {
		switch {
		case state == "pending" && !f.requested[aid]:
			requested[aid] = true
		case state != "pending" && !f.resolved[aid]:
			resolved[aid] = true
		}
	}
	owed := func() int { return len(seqs) + len(requested) + len(resolved) }
	// Deliveries come in order, all that are owed at once, from the
	// outbox: the first shows whether anything acknowledged came again,
	// and with nothing owed a moment's quiet shows it too.
	quiet := time.NewTimer(300 * time.Millisecond)
	defer quiet.Stop()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		var d channelFrame
		var ok bool
		select {
		case d, ok = <-frames:
			if !ok {
				d.closed = true
			}
		case <-quiet.C:
			if owed() == 0 {
				return
			}
			continue
		case <-deadline.C:
			d.closed = true
		}
		switch {
		case d.closed:
			fig.lost += owed()
			t.Errorf("%s channel, acknowledged up to %d: never sent again %d deliveries, %d pending prompts, %d retractions: %v %v %v",
				name, f.acked, len(seqs), len(requested), len(resolved), seqs, requested, resolved)
			return
		case d.reset:
			fig.corrupted++
			t.Errorf("%s channel: a stream reset, acknowledged up to %d", name, f.acked)
			return
		case d.seq <= f.acked:
			fig.lost++
			t.Errorf("%s channel: delivery %d (%s %s) sent again, though its acknowledgement up to %d was answered", name, d.seq, d.event, d.action, f.acked)
			return
		}
		if want, ok := seqs[d.seq]; ok {
			if want.event != d.event || want.action != d.action {
				fig.corrupted++
				t.Errorf("%s channel: delivery %d was %s %s, is %s %s", name, d.seq, want.event, want.action, d.event, d.action)
			}
			delete(seqs, d.seq)
		}
		switch d.event {
		case eventRequested:
			delete(requested, d.action)
		case eventResolved:
			delete(resolved, d.action)
		}
		if owed() == 0 {
			return
		}
	}
}

// jsonEqual reports whether a, a decoded JSON value or raw JSON, and b,
// raw JSON, are the same value.
func jsonEqual(a any, b json.RawMessage) bool {
	if raw, ok := a.(json.RawMessage); ok {
		if err := json.Unmarshal(raw, &a); err != nil {
			return false
		}
	}
	var bv any
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&bv); err != nil {
		return false
	}
	return reflect.DeepEqual(a, bv)
}

// awaitJobsEnd starts the load's runners again on the gateway at base and
// waits for every direct execution of a tool in the ledger to end: a job
// the cuts left queued, dispatched or running is run again, never lost.
// The runners come back under their consumer ids, so that the jobs they
// held are not left for their grace period to end.
func awaitJobsEnd(t *testing.T, client *http.Client, base string, l *cutLedger) (ended, completed int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	startRunners(ctx, &wg, base)
	ids := map[string]bool{}
	for id := range l.jobExecs {
		ids[id] = true
	}
	for _, a := range l.actions {
		if a.answer == "approved" {
			ids[a.exec] = true
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for id := range ids {
		for {
			status, ex, err := send(ctx, client, http.MethodGet, base+"/v0/executions/"+id, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, _ := ex["status"].(string)
			if status == 200 && (s == "completed" || s == "failed" || s == "cancelled") {
				ended++
				if s == "completed" {
					completed++
				}
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("execution %s of a tool call has not ended: %d %v", id, status, ex)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return ended, completed
}
