package gateway

import (
	"errors"
	"net"
	"regexp"
	"strings"

	"github.com/valyala/fasthttp"
)

// EdgePrefix is the path under which a hub passes requests on to the edge
// boxes linked to it: /edge/<name>/... reaches the edge box named name,
// which serves it as /... (docs/cluster.md, "Edge boxes").
const EdgePrefix = "/edge/"

// The codes of an edge box's refusals of connections passed on by a hub.
const (
	// CodeEdgeMisdirected: a request on a connection passed on by a hub
	// names another edge box, or no edge box, in its path (421; the
	// connection is closed, so that the client opens a fresh one).
	CodeEdgeMisdirected = "EDGE_MISDIRECTED"
	// CodeEdgeTokenRequired: the edge box runs with no token, which trusts
	// whoever reaches it; it serves no one through a hub (403).
	CodeEdgeTokenRequired = "EDGE_TOKEN_REQUIRED"
)

// Edges passes a hub's requests for an edge box on to it (relay.Edges).
type Edges interface {
	// Pass answers ctx by passing its connection on to the edge box named
	// name, or refuses it.
	Pass(ctx *fasthttp.RequestCtx, name string)
}

// edgeName matches the names an edge box may go by: one NATS subject
// token, so that it can name the edge's subject.
var edgeName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidEdgeName reports whether name can name an edge box: 1 to 64
// letters, digits, '-' or '_'.
func ValidEdgeName(name string) bool { return edgeName.MatchString(name) }

var (
	errEdgeName        = errors.New("validation error: an edge box's name is 1 to 64 letters, digits, '-' or '_'")
	errEdgeMisdirected = errors.New("misdirected request: this connection reaches an edge box through its hub, and the path does not name it; send other requests on another connection")
	errEdgeToken       = errors.New("forbidden: this edge box runs without a token and serves no one through its hub; start it with --token or --jwt-secret")
)

// edgeOf splits a hub's path /edge/<name>/rest into name; ok is false when
// path is not under EdgePrefix.
func edgeOf(path string) (name string, ok bool) {
	rest, ok := strings.CutPrefix(path, EdgePrefix)
	if !ok {
		return "", false
	}
	name, _, _ = strings.Cut(rest, "/")
	return name, true
}

// passToEdge passes a hub's request under EdgePrefix on to its edge box.
func (s *Server) passToEdge(ctx *fasthttp.RequestCtx, name string) {
	if !ValidEdgeName(name) {
		s.writeError(ctx, &guardError{fasthttp.StatusBadRequest, CodeValidation, errEdgeName})
		return
	}
	// The body is read here, under this gateway's bounds and read timeout,
	// before anything is dialed: passed on as a stream, a slow client's
	// upload would be bounded by the write to the edge box instead.
	if err := readBody(ctx, s.opts.MaxBodyBytes); err != nil {
		s.writeError(ctx, err)
		return
	}
	s.opts.Edges.Pass(ctx, name)
}

// ServeEdge serves, as ServeEdge's edge box (Options.EdgeName), the
// connections a hub passes on: accepted on ln, the edge's end of its link
// to the hub. Their requests are for /edge/<EdgeName>/..., served as the
// paths below it.
func (s *Server) ServeEdge(ln net.Listener) error {
	return s.Serve(edgeListener{ln})
}

// edgeListener marks the connections it accepts as passed on by a hub.
type edgeListener struct{ net.Listener }

func (l edgeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return edgeConn{c}, nil
}

// edgeConn is a connection a hub passed on; its local address says so to
// the request handler, through the connection wrappers around it.
type edgeConn struct{ net.Conn }

func (c edgeConn) LocalAddr() net.Addr { return edgeAddr{c.Conn.LocalAddr()} }

// CloseWrite half-closes the connection where its kind allows.
func (c edgeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

type edgeAddr struct{ net.Addr }

// fromHub reports whether ctx's connection was passed on by a hub.
func fromHub(ctx *fasthttp.RequestCtx) bool {
	_, ok := ctx.LocalAddr().(edgeAddr)
	return ok
}

// edgeRequest checks a request a hub passed on and strips the edge's
// prefix from its path; an error answers it instead.
func (s *Server) edgeRequest(ctx *fasthttp.RequestCtx) error {
	if s.auth.Open() {
		return &guardError{fasthttp.StatusForbidden, CodeEdgeTokenRequired, errEdgeToken}
	}
	prefix := EdgePrefix + s.opts.EdgeName
	path := string(ctx.Path())
	rest, ok := strings.CutPrefix(path, prefix)
	if s.opts.EdgeName == "" || !ok || (rest != "" && rest[0] != '/') {
		ctx.SetConnectionClose()
		return &guardError{fasthttp.StatusMisdirectedRequest, CodeEdgeMisdirected, errEdgeMisdirected}
	}
	if rest == "" {
		rest = "/"
	}
	ctx.URI().SetPath(rest)
	return nil
}
