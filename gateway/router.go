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

// match finds the route for a request. When the path exists under other
// methods only, allowed lists them for a 405 answer.
func (r *router) match(method, path string) (*route, []string, string) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	var methods []string
	for _, rt := range r.routes {
		params, ok := rt.matchPath(segs)
		if !ok {
			continue
		}
		if rt.method == method {
			return rt, params, ""
		}
		methods = append(methods, rt.method)
	}
	sort.Strings(methods)
	return nil, nil, strings.Join(methods, ", ")
}

func (rt *route) matchPath(segs []string) ([]string, bool) {
	if len(segs) != len(rt.segs) {
		return nil, false
	}
	var params []string
	for i, s := range rt.segs {
		if s == "{}" {
			if segs[i] == "" {
				return nil, false
			}
			params = append(params, segs[i])
			continue
		}
		if s != segs[i] {
			return nil, false
		}
	}
	return params, true
}
