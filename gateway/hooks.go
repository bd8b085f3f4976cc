package gateway

import (
	"context"
	"net/http"
	"time"

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

// hookTimeout bounds a hook's work for one request.
const hookTimeout = 30 * time.Second

func (s *Server) serveHook(h channel.Hook) func(*call) error {
	return func(c *call) error {
		hdr := make(http.Header)
		for k, v := range c.ctx.Request.Header.All() {
			hdr.Add(string(k), string(v))
		}
		// A context of its own: the request's is recycled once answered,
		// and the hook's calls (to the kernel, to the platform) may leave
		// goroutines that still hold theirs.
		ctx, cancel := context.WithTimeout(context.Background(), hookTimeout)
		defer cancel()
		reply := h.Serve(ctx, hdr, c.ctx.PostBody())
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
