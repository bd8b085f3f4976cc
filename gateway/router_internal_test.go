package gateway

import (
	"strconv"
	"strings"
	"testing"
)

// benchRouter is the gateway's /v0 route table followed by 30 routes
// standing in for the protocol surfaces' (mounted last, as New mounts
// them), the size of the real table.
func benchRouter() *router {
	s := &Server{}
	r := s.buildRoutes()
	s.peerRoutes(r)
	s.actionRoutes(r)
	s.channelRoutes(r)
	for i := range 30 {
		r.add("GET", "/surface/v1/things"+strconv.Itoa(i)+"/{}/events", false, nil)
	}
	return r
}

// BenchmarkRouterMatch measures the hand-written router on the bench's
// hottest route, on the last route of the table and on a miss:
//
//	go test -run '^$' -bench RouterMatch -benchmem ./gateway/
func BenchmarkRouterMatch(b *testing.B) {
	r := benchRouter()
	for _, c := range []struct{ name, method, path string }{
		{"intent", "POST", "/v0/agents/intent"},
		{"last-route", "GET", "/surface/v1/things29/abc/events"},
		{"not-found", "GET", "/v0/nothing/here"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var params [2]string
			for b.Loop() {
				r.match(c.method, c.path, params[:])
			}
		})
	}
}

// TestRouterMatch pins the answers the router gives: a route with its
// parameters, the methods of a path that exists under others only (405),
// or nothing (404).
func TestRouterMatch(t *testing.T) {
	r := benchRouter()
	for _, c := range []struct {
		method, path, pattern, params, allowed string
	}{
		{"POST", "/v0/agents/intent", "/v0/agents/intent", "[]", ""},
		{"GET", "/v0/executions/ex-1/events", "/v0/executions/{}/events", "[ex-1]", ""},
		{"POST", "/v0/runners/r1/results", "/v0/runners/{}/results", "[r1]", ""},
		{"DELETE", "/v0/runners/r1", "/v0/runners/{}", "[r1]", ""},
		{"PUT", "/v0/executions", "", "[]", "GET, POST"},
		{"GET", "/v0/runners//results", "", "[]", ""},
		{"GET", "/v0/nothing/here", "", "[]", ""},
	} {
		rt, params, allowed := r.match(c.method, c.path, nil)
		pattern := ""
		if rt != nil {
			pattern = rt.pattern
		}
		if pattern != c.pattern || "["+strings.Join(params, " ")+"]" != c.params || allowed != c.allowed {
			t.Errorf("%s %s: route %q params %v allowed %q; want %q %s %q", c.method, c.path, pattern, params, allowed, c.pattern, c.params, c.allowed)
		}
	}
}
