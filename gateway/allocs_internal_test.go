package gateway

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestGuardAllocs bounds what the checks every request passes through
// allocate on the common request: they run for each of an execution's
// hops, and an innocent-looking conversion or split in them is easy to
// bring back.
func TestGuardAllocs(t *testing.T) {
	r := benchRouter()
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.SetHost("127.0.0.1:8080")
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.Header.SetContentLength(2)
	var params [2]string
	ids := []string{"ex-1"}
	for name, f := range map[string]func(){
		"match": func() {
			if rt, _, _ := r.match("POST", "/v0/runners/r1/results", params[:]); rt == nil {
				t.Fatal("no route")
			}
		},
		"checkMediaType":  func() { _ = checkMediaType(&ctx, false) },
		"checkRequestIDs": func() { _ = checkRequestIDs(&ctx, ids) },
		"traceID":         func() { _ = traceID(ctx.Request.Header.Peek("traceparent")) },
		"parseSeq":        func() { _ = parseSeq(ctx.QueryArgs().Peek("after_sequence")) },
		"plainLoopback":   func() { _ = plainLoopback(ctx.Host()) },
		"methodLabel":     func() { _ = methodLabel(ctx.Method()) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want none", name, n)
		}
	}
	// A fresh id: the uuid package's read of the random source, and the
	// id's text.
	if n := testing.AllocsPerRun(100, func() { EchoRequestID(&ctx) }); n > 2 {
		t.Errorf("EchoRequestID: %v allocations, want at most 2", n)
	}
}

// TestPlainLoopbackAgrees pins plainLoopback as a shortcut that accepts
// only what hostName and loopbackName accept.
func TestPlainLoopbackAgrees(t *testing.T) {
	for _, h := range []string{
		"localhost", "localhost:8080", "localhost:", "127.0.0.1", "127.0.0.1:1",
		"localhost:1:2", "localhost:[1]", "localhost]:1", "LOCALHOST:1", "localhost.:1",
		"127.0.0.01:1", "127.0.0.1.nip.io", "evil.example", "[::1]:1", "", ":80",
	} {
		if plainLoopback([]byte(h)) && !LoopbackHost(h) {
			t.Errorf("plainLoopback(%q) accepts what LoopbackHost refuses", h)
		}
	}
	for _, h := range []string{"localhost", "localhost:8080", "127.0.0.1:65535"} {
		if !plainLoopback([]byte(h)) {
			t.Errorf("plainLoopback(%q) = false", h)
		}
	}
}
