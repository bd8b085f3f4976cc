package gateway_test

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/internal/syncbuf"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// echoSurface is a protocol surface for tests: it answers in its own
// error shape, streams a fixed list of items, and fails one route with an
// error only it knows (a 500).
type echoSurface struct{}

func (echoSurface) Mount() string { return "/echo/v1" }

func (echoSurface) Routes() []protocol.Route {
	return []protocol.Route{
		{Method: "GET", Pattern: "/things/{}", Handle: func(r *protocol.Request) error {
			if r.Params[0] == "broken" {
				return errors.New("disk on fire")
			}
			r.Ctx.SetContentType("application/json")
			r.Ctx.SetBodyString(`{"thing":"` + r.Params[0] + `","by":"` + r.Principal.Subject + `"}`)
			return nil
		}},
		{Method: "GET", Pattern: "/things/{}/events", Stream: true, Handle: func(r *protocol.Request) error {
			r.Gateway.SSE(r, "echo", echoRender, stream.SSEOptions{}, false, func(*stream.Options) (stream.Source, func()) {
				return &sliceSource{items: []string{"a", "b", r.Params[0]}}, nil
			})
			return nil
		}},
	}
}

func (echoSurface) WriteError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"echo_error":"` + code + `"}`)
}

func (s echoSurface) Fail(ctx *fasthttp.RequestCtx, err error) {
	s.WriteError(ctx, fasthttp.StatusInternalServerError, "INTERNAL", err.Error())
}

var echoRender = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	f.ID = strconv.AppendUint(f.ID, it.Seq, 10)
	f.Event = "echo"
	f.Data = append(f.Data, `"`+string(it.Data)+`"`...)
	return true, nil
})

// sliceSource gives its items once, then ends.
type sliceSource struct {
	mu    sync.Mutex
	items []string
	next  int
}

func (s *sliceSource) Next(buf []stream.Item) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < len(buf) && s.next < len(s.items) {
		buf[n] = stream.Item{Seq: uint64(s.next + 1), Type: "echo", Data: []byte(s.items[s.next])}
		s.next++
		n++
	}
	if s.next == len(s.items) {
		return n, stream.ErrEnd
	}
	return n, nil
}

func (s *sliceSource) OnWake(func()) {}
func (s *sliceSource) Close()        {}

func TestSurfaceRoutesAreMountedAuthenticatedAndStreamed(t *testing.T) {
	logs := &syncbuf.Buffer{}
	c := node.Options{Auth: auth.Options{StaticToken: "s3cret"}, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	c.Server.Surfaces = []protocol.Surface{echoSurface{}}
	s := start(t, c)
	a := newAPI(t, s)

	status, body, _ := a.do("GET", "/echo/v1/things/x", nil)
	if status != 401 || string(body) != `{"echo_error":"UNAUTHORIZED"}` {
		t.Fatalf("without a token: %d %s, want the surface's own 401", status, body)
	}
	a.token = "s3cret"
	if got := a.json("GET", "/echo/v1/things/x", nil, 200); got["thing"] != "x" || got["by"] != "static" {
		t.Fatalf("routed answer: %v", got)
	}
	if status, _, _ := a.do("GET", "/echo/v1/nothing", nil); status != 404 {
		t.Fatalf("an unknown path under the mount: %d, want 404", status)
	}
	// A handler's error is answered by the surface, in its own shape, and
	// the gateway logs the 500 with the request it failed.
	if status, body, _ := a.do("GET", "/echo/v1/things/broken", nil); status != 500 || string(body) != `{"echo_error":"INTERNAL"}` {
		t.Fatalf("a handler's error: %d %s, want the surface's own 500", status, body)
	}
	if l := logs.String(); !strings.Contains(l, "request failed") || !strings.Contains(l, "disk on fire") || !strings.Contains(l, "/echo/v1/things/broken") {
		t.Fatalf("the 500 is not logged with its error and path:\n%s", l)
	}

	req, _ := http.NewRequest("GET", s.URL+"/echo/v1/things/z/events", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(bufio.NewReader(resp.Body))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "id: 3\nevent: echo\ndata: \"z\"\n\n") || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %s %q", resp.Header.Get("Content-Type"), raw)
	}
}
