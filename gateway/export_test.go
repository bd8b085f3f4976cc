package gateway

// RouteKeys returns "METHOD pattern" for every route s serves, in the order
// they were added, so that the access matrix test covers every one of them.
func RouteKeys(s *Server) []string {
	out := make([]string, 0, len(s.routes.routes))
	for _, r := range s.routes.routes {
		out = append(out, r.method+" "+r.pattern)
	}
	return out
}
