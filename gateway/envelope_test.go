package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// envelope is a mount's JSON error shape: the kernel API's {error, code,
// details?}, which /agent-runtime and /aap/v1 share, or the Runtime API's
// {error, details: {code}}.
type envelope int

const (
	kernelShape envelope = iota
	runtimeShape
)

// errorMount is a mount, a path of it served for GET only, a POST route
// of it, and one of its streams.
type errorMount struct {
	name, getOnly, post, stream string
	shape                       envelope
}

var errorMounts = []errorMount{
	{"/v0", "/v0/health", "/v0/executions", "/v0/executions/x/stream", kernelShape},
	{"/agent-runtime", "/agent-runtime/sessions/x", "/agent-runtime/sessions", "/agent-runtime/sessions/x/events", kernelShape},
	{"/aap/v1", "/aap/v1/meta", "/aap/v1/session/x", "/aap/v1/session/x/stream", kernelShape},
	{"/runtime/v1", "/runtime/v1/capabilities", "/runtime/v1/sessions", "/runtime/v1/executions/x/events", runtimeShape},
	// A path under no mount is answered as /v0 answers.
	{"no mount", "/ui/", "/nowhere", "", kernelShape},
}

// wantEnvelope checks that an answer is the mount's JSON error with status
// and code, its sentence on one line.
func wantEnvelope(t *testing.T, what string, shape envelope, status int, body []byte, hdr http.Header, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("%s: %d %s, want %d in JSON: %q", what, status, hdr.Get("Content-Type"), wantStatus, body)
	}
	var out struct {
		Error   *string        `json:"error"`
		Code    *string        `json:"code"`
		Details map[string]any `json:"details"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Error == nil || *out.Error == "" {
		t.Fatalf("%s: not a JSON error with a sentence: %v: %q", what, err, body)
	}
	if strings.ContainsAny(*out.Error, "\r\n") {
		t.Fatalf("%s: the sentence spans lines: %q", what, *out.Error)
	}
	code := ""
	switch shape {
	case kernelShape:
		if out.Code != nil {
			code = *out.Code
		}
	case runtimeShape:
		if out.Code != nil {
			t.Fatalf("%s: the Runtime API's error has no top-level code: %q", what, body)
		}
		code, _ = out.Details["code"].(string)
	}
	if code != wantCode {
		t.Fatalf("%s: code %q, want %s: %q", what, code, wantCode, body)
	}
}

// TestEveryMountAnswersEveryRefusalInItsEnvelope: the router's, the
// guard's and the stream admission's refusals (404, 405, 413, 421, 429)
// come in the JSON envelope of the mount the path belongs to, a path under
// no mount gets /v0's, and so does a 431.
func TestEveryMountAnswersEveryRefusalInItsEnvelope(t *testing.T) {
	var o node.Options
	o.Server.MaxBodyBytes = 1 << 10
	o.Server.ConnectRate, o.Server.ConnectBurst = 0.001, 1
	s := start(t, o)
	for _, m := range errorMounts {
		t.Run(strings.TrimPrefix(m.name, "/"), func(t *testing.T) {
			do := func(method, path string, body any, hdr ...string) (int, []byte, http.Header) {
				return nodetest.Do(t, nil, method, s.URL+path, body, hdr...)
			}
			st, b, h := do("GET", m.post+"/no/such/route", nil)
			wantEnvelope(t, "unknown route", m.shape, st, b, h, 404, "NOT_FOUND")

			st, b, h = do("DELETE", m.getOnly, nil)
			wantEnvelope(t, "wrong method", m.shape, st, b, h, 405, "METHOD_NOT_ALLOWED")
			if h.Get("Allow") == "" {
				t.Fatalf("405 without Allow")
			}

			st, b, h = do("GET", m.getOnly, nil, "Host", "rebound.example")
			wantEnvelope(t, "foreign host", m.shape, st, b, h, 421, "HOST_NOT_ALLOWED")

			// Headers past the 4 KiB read buffer are refused before the
			// request line is parsed: no mount is known, /v0's shape it is.
			st, b, h = do("GET", m.getOnly, nil, "X-Big", strings.Repeat("x", 8<<10))
			wantEnvelope(t, "headers too large", kernelShape, st, b, h, 431, "HEADERS_TOO_LARGE")

			if m.name != "no mount" {
				st, b, h = do("POST", m.post, `{"x":"`+strings.Repeat("x", 2<<10)+`"}`, "Content-Type", "application/json")
				wantEnvelope(t, "body too large", m.shape, st, b, h, 413, "PAYLOAD_TOO_LARGE")
			}
		})
	}
	// The admission's burst of one is spent by the first stream asked for;
	// every mount's next one is refused in its own envelope.
	nodetest.Do(t, nil, "GET", s.URL+"/v0/executions/x/stream", nil)
	for _, m := range errorMounts {
		if m.stream == "" {
			continue
		}
		st, b, h := nodetest.Do(t, nil, "GET", s.URL+m.stream, nil)
		wantEnvelope(t, m.name+" stream over the connection rate", m.shape, st, b, h, 429, "RATE_LIMITED")
		if h.Get("Retry-After") == "" {
			t.Fatalf("%s: 429 without Retry-After", m.name)
		}
	}
}

// TestErrorSentencesAreOneLine: errors a surface joins to its sentinels
// (errors.Join puts a newline between them) are answered on one line.
func TestErrorSentencesAreOneLine(t *testing.T) {
	s := start(t, node.Options{})
	cases := []struct {
		method, path string
		body         any
		status       int
		code         string
	}{
		{"PUT", "/aap/v1/session", map[string]any{"agent": map[string]any{"name": "a"}, "messages": []any{map[string]any{"role": "assistant", "content": "x"}}}, 400, "VALIDATION_ERROR"},
		{"GET", "/aap/v1/session/nope", nil, 404, "NOT_FOUND"},
		{"PUT", "/aap/v1/session", map[string]any{"agent": map[string]any{"name": "nobody"}, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, "NOT_FOUND"},
		{"POST", "/agent-runtime/commands/respond_action", map[string]any{"action_id": "input:x:y", "decision": "allow_once"}, 404, "NOT_FOUND"},
	}
	for _, c := range cases {
		st, b, h := nodetest.Do(t, nil, c.method, s.URL+c.path, c.body, "Content-Type", "application/json")
		wantEnvelope(t, c.method+" "+c.path, kernelShape, st, b, h, c.status, c.code)
	}
}
