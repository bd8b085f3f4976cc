package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// obj is a decoded JSON object.
type obj = map[string]any

// testKernel are kernel options with short timers so tests run fast.
func testKernel() kernel.Options {
	return kernel.Options{AgentGrace: 300 * time.Millisecond, RunnerGrace: 300 * time.Millisecond, RetryBase: 20 * time.Millisecond}
}

func start(t *testing.T, c node.Options) *nodetest.Server {
	t.Helper()
	if c.Kernel == (kernel.Options{}) {
		c.Kernel = testKernel()
	}
	return nodetest.Start(t, c)
}

// api is a JSON client for one server.
type api struct {
	t     *testing.T
	base  string
	token string
	hc    *http.Client // nil: http.DefaultClient
}

func (a *api) client() *http.Client {
	if a.hc != nil {
		return a.hc
	}
	return http.DefaultClient
}

func newAPI(t *testing.T, s *nodetest.Server) *api { return &api{t: t, base: s.URL} }

// do sends a request and returns the status and raw body.
func (a *api) do(method, path string, body any, hdr ...string) (int, []byte, http.Header) {
	a.t.Helper()
	if a.token != "" {
		hdr = append([]string{"Authorization", "Bearer " + a.token}, hdr...)
	}
	return nodetest.Do(a.t, a.hc, method, a.base+path, body, hdr...)
}

// json sends a request, checks the status and decodes the JSON answer.
func (a *api) json(method, path string, body any, want int, hdr ...string) obj {
	a.t.Helper()
	status, data, _ := a.do(method, path, body, hdr...)
	return nodetest.Object(a.t, method, path, status, data, want)
}

// fail sends a request that must fail with status and code.
func (a *api) fail(method, path string, body any, status int, code string) obj {
	a.t.Helper()
	out := a.json(method, path, body, status)
	if out["code"] != code {
		a.t.Fatalf("%s %s: code %v, want %s; body %v", method, path, out["code"], code, out)
	}
	if msg, _ := out["error"].(string); msg == "" {
		a.t.Fatalf("%s %s: error body without message: %v", method, path, out)
	}
	return out
}

func (a *api) create(agentID string, input any) obj {
	a.t.Helper()
	return a.json("POST", "/v0/executions", obj{"agent_id": agentID, "input": input}, 201)
}

func (a *api) intent(execID, session string, intent obj, want int) obj {
	a.t.Helper()
	return a.json("POST", "/v0/agents/intent", obj{"execution_id": execID, "session_id": session, "intent": intent}, want)
}

func (a *api) events(execID string) []obj {
	a.t.Helper()
	page := a.json("GET", "/v0/executions/"+execID+"/events?limit=1000", nil, 200)
	var out []obj
	for _, e := range page["events"].([]any) {
		out = append(out, e.(obj))
	}
	return out
}

func (a *api) eventTypes(execID string) []string {
	var types []string
	for _, e := range a.events(execID) {
		types = append(types, e["type"].(string))
	}
	return types
}

// waitStatus polls an execution until it has status want.
func (a *api) waitStatus(execID, want string) obj {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ex := a.json("GET", "/v0/executions/"+execID, nil, 200)
		if ex["status"] == want {
			return ex
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("execution %s: status %v, want %s; events %v", execID, ex["status"], want, a.eventTypes(execID))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// frame is one SSE frame, with the helpers the tests use on it.
type frame ssetest.Frame

func (f frame) obj(t *testing.T) obj {
	t.Helper()
	var o obj
	if err := json.Unmarshal([]byte(f.Data), &o); err != nil {
		t.Fatalf("frame %s data is not JSON: %v: %q", f.Event, err, f.Data)
	}
	return o
}

// sseStream reads an SSE response in the background.
type sseStream struct {
	t      *testing.T
	resp   *http.Response
	cancel context.CancelFunc
	frames <-chan ssetest.Frame
	raw    *bytes.Buffer // everything read, for framing checks
}

// openSSE connects to an SSE endpoint; it fails the test on a non-200.
func (a *api) openSSE(path string, hdr ...string) *sseStream {
	a.t.Helper()
	s, status, body := a.trySSE(path, hdr...)
	if status != 200 {
		a.t.Fatalf("GET %s: status %d: %s", path, status, body)
	}
	return s
}

func (a *api) trySSE(path string, hdr ...string) (*sseStream, int, string) {
	a.t.Helper()
	ctx, cancel := context.WithCancel(a.t.Context())
	req, err := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
	if err != nil {
		a.t.Fatal(err)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := a.client().Do(req)
	if err != nil {
		cancel()
		a.t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return nil, resp.StatusCode, string(body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		a.t.Fatalf("GET %s: content type %q", path, ct)
	}
	s := &sseStream{t: a.t, resp: resp, cancel: cancel, raw: &bytes.Buffer{}}
	s.frames = ssetest.Stream(io.TeeReader(resp.Body, s.raw), 4096)
	a.t.Cleanup(s.close)
	return s, 200, ""
}

func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// next returns the next frame or fails after a timeout.
func (s *sseStream) next() frame {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if !ok {
			s.t.Fatalf("stream ended while a frame was expected")
		}
		return frame(f)
	case <-time.After(10 * time.Second):
		s.t.Fatalf("no frame within 10s")
	}
	return frame{}
}

// expect returns the next frame, which must be of type typ.
func (s *sseStream) expect(typ string) obj {
	s.t.Helper()
	f := s.next()
	if f.Event != typ {
		s.t.Fatalf("frame %s (%s), want %s", f.Event, f.Data, typ)
	}
	return f.obj(s.t)
}

// quiet asserts no frame arrives for d.
func (s *sseStream) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if ok {
			s.t.Fatalf("unexpected frame %s: %s", f.Event, f.Data)
		}
	case <-time.After(d):
	}
}

// ended waits for the server to end the stream.
func (s *sseStream) ended() {
	s.t.Helper()
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				return
			}
			s.t.Fatalf("frame %s after the expected end: %s", f.Event, f.Data)
		case <-time.After(10 * time.Second):
			s.t.Fatalf("stream did not end within 10s")
		}
	}
}

// agent is a test agent holding one SSE connection.
type agent struct {
	*sseStream
	id, consumer string
}

func (a *api) agent(id, consumer string) *agent {
	a.t.Helper()
	return &agent{sseStream: a.openSSE(fmt.Sprintf("/v0/agents/stream?agent_id=%s&consumer_id=%s", id, consumer)), id: id, consumer: consumer}
}

// runner is a test runner holding one SSE connection.
func (a *api) runner(id, consumer string, caps ...string) *sseStream {
	a.t.Helper()
	return a.openSSE(fmt.Sprintf("/v0/runners/stream?runner_id=%s&consumer_id=%s&capabilities=%s", id, consumer, strings.Join(caps, ",")))
}

// running starts a server with an agent agentID connected and one
// execution assigned to it: the start of most flow tests. It returns the
// client, the agent, and the execution's id and lease.
func running(t *testing.T, agentID string) (a *api, ag *agent, id, lease string) {
	t.Helper()
	a = newAPI(t, start(t, node.Options{}))
	ag = a.agent(agentID, "c1")
	id, lease = a.assigned(ag, nil)
	return a, ag, id, lease
}

// assigned creates an execution for a connected agent and returns its id
// and lease (session_id).
func (a *api) assigned(ag *agent, input any) (string, string) {
	a.t.Helper()
	ex := a.create(ag.id, input)
	if ex["status"] != "running" {
		a.t.Fatalf("created with a connected agent: status %v, want running", ex["status"])
	}
	push := ag.expect("execution.assigned")
	if push["execution_id"] != ex["id"] {
		a.t.Fatalf("assigned %v, want %v", push["execution_id"], ex["id"])
	}
	return ex["id"].(string), push["session_id"].(string)
}

func typesEqual(got []string, want ...string) bool {
	return strings.Join(got, ",") == strings.Join(want, ",")
}
