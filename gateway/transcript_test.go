package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/node"
)

var updateTranscripts = flag.Bool("update-transcripts", false, "rewrite gateway/testdata/transcripts from this run")

// Transcripts pin the bytes every /v0 stream puts on the wire for one
// scenario, ids and times normalized: a change of any stream's framing, of
// its frames' order or of what it carries shows up as a diff against
// testdata/transcripts. Regenerate with -update-transcripts only for a
// deliberate change of the wire.

var (
	uuidRe  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRe  = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	msNumRe = regexp.MustCompile(`"(duration_ms|heartbeat_ms|latency_ms)":\d+`)
)

// normalizer replaces ids by their order of first appearance, so that a
// transcript still shows which frames name the same thing.
type normalizer struct {
	ids   map[string]string
	epoch string
}

func (n *normalizer) apply(b []byte) []byte {
	if n.epoch != "" {
		b = bytes.ReplaceAll(b, []byte(n.epoch), []byte("<epoch>"))
	}
	b = uuidRe.ReplaceAllFunc(b, func(id []byte) []byte {
		v, ok := n.ids[string(id)]
		if !ok {
			v = "<id" + strconv.Itoa(len(n.ids)+1) + ">"
			n.ids[string(id)] = v
		}
		return []byte(v)
	})
	b = timeRe.ReplaceAll(b, []byte("<time>"))
	return msNumRe.ReplaceAll(b, []byte(`"$1":<n>`))
}

func checkTranscript(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "transcripts", name)
	if *updateTranscripts {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-transcripts to record it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("transcript %s changed:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// readWSTranscript reads a socket's frames until it closes, one per line
// (binary frames quoted, after normalizing), and the close code and reason
// last.
func readWSTranscript(t *testing.T, c *websocket.Conn, n *normalizer) []byte {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			fmt.Fprintf(&out, "close %d %q\n", websocket.CloseStatus(err), closeReasonOf(err))
			return out.Bytes()
		}
		data = n.apply(data)
		if typ == websocket.MessageBinary {
			fmt.Fprintf(&out, "%s %q\n", typ, maskTimeLengths(data))
			continue
		}
		fmt.Fprintf(&out, "%s %s\n", typ, data)
	}
}

// maskTimeLengths hides the msgpack length prefix of each normalized
// timestamp: a time whose nanoseconds end in zeros is shorter.
func maskTimeLengths(b []byte) []byte {
	mark := []byte("<time>")
	for i := bytes.Index(b, mark); i > 0; {
		b[i-1] = '?'
		j := bytes.Index(b[i+len(mark):], mark)
		if j < 0 {
			break
		}
		i += len(mark) + j
	}
	return b
}

func closeReasonOf(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return ""
}

// readToEnd reads frames until the server ends the stream.
func readToEnd(t *testing.T, st *sseStream) {
	t.Helper()
	for {
		select {
		case _, ok := <-st.frames:
			if !ok {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("stream did not end within 10s")
		}
	}
}

func TestStreamTranscripts(t *testing.T) {
	c := node.Options{}
	c.Server.Heartbeat = time.Hour // no heartbeat lands in a transcript
	s := start(t, c)
	a := newAPI(t, s)
	ag := a.agent("tx-agent", "tx-c1")
	run := a.runner("tx-runner", "tx-r1", "tx.tool")
	id, lease := a.assigned(ag, obj{"q": 1})
	step := a.intent(id, lease, obj{"type": "invoke_tool", "tool_id": "tx.tool", "arguments": obj{"x": 1}, "remote": true, "idempotency_key": "k1"}, 200)["step_id"]
	job := run.expect("job.assigned")
	a.json("POST", "/v0/runners/tx-runner/results", obj{"job_id": job["id"], "execution_id": id, "step_id": step, "success": true, "data": obj{"y": 2}}, 200)
	ag.expect("tool.result")
	a.intent(id, lease, obj{"type": "complete", "output": obj{"done": true}}, 200)
	a.waitStatus(id, "completed")

	n := &normalizer{ids: map[string]string{}, epoch: s.Node.Kernel.Epoch()}
	n.apply([]byte(id)) // the execution is <id1> in every transcript
	for _, tc := range []struct{ name, path string }{
		{"execution-sse-from-start.txt", "/v0/executions/" + id + "/stream"},
		{"execution-sse-after-3.txt", "/v0/executions/" + id + "/stream?after_sequence=3"},
	} {
		st := a.openSSE(tc.path)
		readToEnd(t, st)
		checkTranscript(t, tc.name, n.apply(st.raw.Bytes()))
	}
	for _, proto := range wsProtos() {
		conn, _, err := a.tryWS("/v0/executions/"+id+"/ws", proto)
		if err != nil {
			t.Fatal(err)
		}
		checkTranscript(t, "execution-ws-"+proto+".txt", readWSTranscript(t, conn, n))
	}
	ag.close()
	run.close()
	checkTranscript(t, "agent-sse.txt", n.apply(ag.raw.Bytes()))
	checkTranscript(t, "runner-sse.txt", n.apply(run.raw.Bytes()))

	// The agent's and runner's WebSocket twins: a fresh consumer gets the
	// hello; a reconnect of the SSE consumer from cursor 0 replays what is
	// still retained.
	for _, role := range []string{"agents", "runners"} {
		idKey := map[string]string{"agents": "agent_id=tx-agent&consumer_id=tx-ws", "runners": "runner_id=tx-runner&consumer_id=tx-ws&capabilities=tx.tool"}[role]
		conn, _, err := a.tryWS("/v0/"+role+"/ws?"+idKey, gateway.SubprotocolJSON)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, hello, err := conn.Read(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		checkTranscript(t, role+"-ws-hello.txt", n.apply(hello))
		conn.Close(websocket.StatusNormalClosure, "")
	}
}
