package gateway

import (
	"net/http"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/channel"
)

// hookRoutes mounts the chat platforms' endpoints (Options.Hooks). They
// take no bearer token: each hook authenticates its platform's request
// itself, and their bodies are bounded like any anonymous request's.
func (s *Server) hookRoutes(r *router) {
	for _, h := range s.opts.Hooks {
		r.add("POST", h.Path, true, s.serveHook(h))
		r.routes[len(r.routes)-1].form = h.Form
	}
}

func (s *Server) serveHook(h channel.Hook) func(*call) error {
	return func(c *call) error {
		hdr := make(http.Header)
		for k, v := range c.ctx.Request.Header.All() {
			hdr.Add(string(k), string(v))
		}
		reply := h.Serve(c.ctx, hdr, c.ctx.PostBody())
		if reply.Status == 0 {
			reply.Status = fasthttp.StatusOK
		}
		if reply.ContentType != "" {
			c.ctx.SetContentType(reply.ContentType)
		}
		c.ctx.SetStatusCode(reply.Status)
		c.ctx.SetBody(reply.Body)
		return nil
	}
}
