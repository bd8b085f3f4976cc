package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/node"
)

// randomJSON builds a random JSON value: nested objects and arrays, long
// and unicode strings (with characters JSON must escape), large and
// fractional numbers.
func randomJSON(r *rand.Rand, depth int) any {
	switch k := r.IntN(8); {
	case depth > 3 || k == 0:
		return r.IntN(1 << 20)
	case k == 1:
		return r.Float64() * 1e12
	case k == 2:
		pieces := []string{"a", "é", "日本", "\"", "\\", "\n", "\t", "\u2028", "<script>", "\x01", strings.Repeat("z", 300)}
		var b strings.Builder
		for range r.IntN(6) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	case k == 3:
		return r.IntN(2) == 0
	case k == 4:
		return nil
	case k == 5:
		arr := make([]any, r.IntN(4))
		for i := range arr {
			arr[i] = randomJSON(r, depth+1)
		}
		return arr
	}
	o := obj{}
	for range r.IntN(5) {
		o["k"+strconv.Itoa(r.IntN(100))] = randomJSON(r, depth+1)
	}
	return o
}

// TestRerenderIsByteIdentical: whatever an execution's events hold, the
// bytes a client reads live while it runs are the bytes a client reads when
// it replays the finished execution, on SSE and on both WebSocket
// encodings. A client may thus resume on any connection and at any time.
func TestRerenderIsByteIdentical(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	c := node.Options{}
	c.Server.Heartbeat = time.Hour
	s := start(t, c)
	a := newAPI(t, s)
	ag := a.agent("rr-agent", "rr-c1")
	for range 8 {
		ex := a.create(ag.id, randomJSON(r, 0))
		id := ex["id"].(string)
		live := a.openSSE("/v0/executions/" + id + "/stream")
		var liveWS []*wsClient
		for _, proto := range wsProtos() {
			liveWS = append(liveWS, a.dialWS("/v0/executions/"+id+"/ws", proto))
		}
		lease := ag.expect("execution.assigned")["session_id"].(string)
		for range r.IntN(4) {
			step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "t" + strconv.Itoa(r.IntN(3)), "arguments": randomJSON(r, 1)}, 200)["step_id"]
			a.json("POST", "/v0/agents/step-result", obj{"execution_id": id, "session_id": lease, "step_id": step, "success": r.IntN(2) == 0, "data": randomJSON(r, 1), "error": "e" + strconv.Itoa(r.IntN(9))}, 200)
			ag.expect("tool.result")
		}
		a.intent(id, lease, obj{"type": "complete", "output": randomJSON(r, 0)}, 200)
		readToEnd(t, live)
		replay := a.openSSE("/v0/executions/" + id + "/stream")
		readToEnd(t, replay)
		if !bytes.Equal(live.raw.Bytes(), replay.raw.Bytes()) {
			t.Fatalf("execution %s: SSE bytes differ between live and replay:\nlive   %q\nreplay %q", id, live.raw.Bytes(), replay.raw.Bytes())
		}
		for i, proto := range wsProtos() {
			conn, _, err := a.tryWS("/v0/executions/"+id+"/ws", proto)
			if err != nil {
				t.Fatal(err)
			}
			n := &normalizer{ids: map[string]string{}}
			want := readWSTranscript(t, conn, n)
			got := rawFrames(t, liveWS[i], n)
			if !bytes.Equal(got, want) {
				t.Fatalf("execution %s: %s frames differ between live and replay:\nlive   %s\nreplay %s", id, proto, got, want)
			}
		}
	}
}

// rawFrames reads a socket's frames until it closes, as readWSTranscript
// shows them.
func rawFrames(t *testing.T, w *wsClient, n *normalizer) []byte {
	t.Helper()
	var out bytes.Buffer
	timeout := time.After(15 * time.Second)
	for {
		select {
		case f, ok := <-w.frames:
			if !ok {
				fmt.Fprintf(&out, "close %d %q\n", websocket.CloseStatus(w.err), closeReasonOf(w.err))
				return out.Bytes()
			}
			data := n.apply(f.raw)
			if f.typ == websocket.MessageBinary {
				fmt.Fprintf(&out, "%s %q\n", f.typ, maskTimeLengths(data))
				continue
			}
			fmt.Fprintf(&out, "%s %s\n", f.typ, data)
		case <-timeout:
			t.Fatal("socket not closed within 15s")
		}
	}
}

// TestExecutionStreamKeepsItsConnection: a client that reads an
// execution's stream to its end reuses the connection for its next
// request, instead of dialling for every execution it follows. Agent and
// runner streams, whose disconnect must be noticed at once, close theirs.
func TestExecutionStreamKeepsItsConnection(t *testing.T) {
	s := start(t, node.Options{})
	a := newAPI(t, s)
	ag := a.agent("ka-agent", "ka-c1")
	var ids []string
	for range 3 {
		id, lease := a.assigned(ag, nil)
		a.intent(id, lease, obj{"type": "complete"}, 200)
		ids = append(ids, id)
	}
	var dials atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, id := range ids {
		a.waitStatus(id, "completed")
		resp, err := client.Get(s.URL + "/v0/executions/" + id + "/stream")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Contains(body, []byte("execution.completed")) {
			t.Fatalf("stream of %s: %v %q", id, err, body)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for 3 execution streams, want 1", n)
	}
	resp, err := client.Get(s.URL + "/v0/agents/stream?agent_id=ka-agent&consumer_id=ka-c2")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !resp.Close {
		t.Fatal("an agent stream must close its connection when it ends")
	}
}
