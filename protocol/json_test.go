package protocol_test

import (
	"math"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/protocol"
)

func TestJSONWrite(t *testing.T) {
	const fallback = `{"error":"internal error"}`
	for _, tc := range []struct {
		name    string
		newline bool
		v       any
		status  int
		body    string
		fails   bool
	}{
		{"with newline", true, map[string]any{"a": "<b>"}, 201, `{"a":"\u003cb\u003e"}` + "\n", false},
		{"without newline", false, map[string]any{"a": "<b>"}, 201, `{"a":"\u003cb\u003e"}`, false},
		{"fallback with newline", true, math.NaN(), 500, fallback + "\n", true},
		{"fallback without newline", false, math.NaN(), 500, fallback, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := protocol.JSON{Newline: tc.newline, Fallback: fallback}
			errs := make(chan error, 1)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
				// A body set before is replaced, not appended to.
				ctx.SetBodyString("stale")
				errs <- j.Write(ctx, fasthttp.StatusCreated, tc.v)
			}}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Shutdown() })

			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + ln.Addr().String() + "/")
			if err := fasthttp.Do(req, resp); err != nil {
				t.Fatal(err)
			}
			if status, ct, body := resp.StatusCode(), string(resp.Header.ContentType()), string(resp.Body()); status != tc.status || ct != "application/json" || body != tc.body {
				t.Errorf("answer = %d %s %q, want %d application/json %q", status, ct, body, tc.status, tc.body)
			}
			if err := <-errs; (err != nil) != tc.fails {
				t.Errorf("Write returned %v, want an error: %v", err, tc.fails)
			}
		})
	}
}
