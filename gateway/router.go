package gateway

import (
	"sort"
	"strings"

	"github.com/gatehouse-dev/gatehouse/protocol"
)

// route is one method and path pattern; "{}" segments capture a parameter.
type route struct {
	method  string
	pattern string
	segs    []string
	public  bool // no authentication (health and readiness probes)
	form    bool // takes application/x-www-form-urlencoded bodies (a platform's hook)
	handle  func(*call) error
	// surface, when set, is the protocol surface the route belongs to: it
	// words the gateway's refusals in its protocol.
	surface protocol.Surface
}

// router matches requests to routes. It is built once and read-only after.
type router struct {
	routes []*route
}

func (r *router) add(method, pattern string, public bool, h func(*call) error) {
	r.routes = append(r.routes, &route{
		method: method, pattern: pattern, public: public, handle: h,
		segs: strings.Split(strings.Trim(pattern, "/"), "/"),
	})
}

// mount adds a protocol surface's routes under its prefix.
func (s *Server) mount(r *router, sf protocol.Surface) {
	prefix := strings.TrimSuffix(sf.Mount(), "/")
	for _, pr := range sf.Routes() {
		h := func(c *call) error {
			return pr.Handle(&protocol.Request{Ctx: c.ctx, Principal: c.principal, Params: c.params, Gateway: s})
		}
		if pr.Stream {
			h = s.admit(h)
		}
		r.add(pr.Method, prefix+"/"+strings.TrimPrefix(pr.Pattern, "/"), false, h)
		r.routes[len(r.routes)-1].surface = sf
	}
}

// match finds the route for a request. Its parameters are appended to
// params[:0], which a caller passes to keep them out of a fresh slice.
// When the path exists under other methods only, allowed lists them for a
// 405 answer.
func (r *router) match(method, path string, params []string) (*route, []string, string) {
	path = strings.Trim(path, "/")
	var methods []string
	for _, rt := range r.routes {
		ps, ok := rt.matchPath(path, params[:0])
		if !ok {
			continue
		}
		if rt.method == method {
			return rt, ps, ""
		}
		methods = append(methods, rt.method)
	}
	sort.Strings(methods)
	return nil, nil, strings.Join(methods, ", ")
}

// matchPath matches path, trimmed of its outer slashes, segment by segment
// as strings.Split would cut it, without allocating the segments: a route
// is tried against every request.
func (rt *route) matchPath(path string, params []string) ([]string, bool) {
	rest := path
	for i, s := range rt.segs {
		seg, tail, more := strings.Cut(rest, "/")
		if more != (i < len(rt.segs)-1) {
			return nil, false
		}
		rest = tail
		if s == "{}" {
			if seg == "" {
				return nil, false
			}
			params = append(params, seg)
			continue
		}
		if s != seg {
			return nil, false
		}
	}
	return params, true
}
