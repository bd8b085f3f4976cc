package gateway

import (
	"sort"
	"strings"
)

// route is one method and path pattern; "{}" segments capture a parameter.
type route struct {
	method  string
	pattern string
	segs    []string
	public  bool // no authentication (health and readiness probes)
	handle  func(*call)
}

// router matches requests to routes. It is built once and read-only after.
type router struct {
	routes []*route
}

func (r *router) add(method, pattern string, public bool, h func(*call)) {
	r.routes = append(r.routes, &route{
		method: method, pattern: pattern, public: public, handle: h,
		segs: strings.Split(strings.Trim(pattern, "/"), "/"),
	})
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
