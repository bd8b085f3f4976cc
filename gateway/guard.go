package gateway

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// anonymousBodyLimit bounds what is read of a request that carries no
// valid credential (and of the public routes): enough for any error
// report, far from what a flood of slow uploads could turn into memory.
const anonymousBodyLimit = 64 << 10

// drainLimit is the most of a refused body read (and dropped) so that its
// sender gets the answer.
const (
	drainLimit = 4 << 20
	drainTime  = time.Second
)

// errTooLarge answers a body over its route's limit, announced or sent.
var errTooLarge = &guardError{fasthttp.StatusRequestEntityTooLarge, CodeTooLarge, errBodyTooLarge}

// Errors of the request guard, answered before a handler runs.
var (
	errBodyTooLarge    = errors.New("request body too large")
	errMediaType       = errors.New("unsupported media type: send the body as Content-Type: application/json")
	errForeignOrigin   = errors.New("forbidden: requests from another origin are refused; list the origin with --cors-origins")
	errHostNotAllowed  = errors.New("misdirected request: this gateway has no token and answers only to loopback host names; set a token or list the host with --allowed-hosts")
	errReadTimedOut    = errors.New("request timeout: the request did not arrive in time")
	errHeadersTooLarge = errors.New("request header fields too large: at most 4 KiB of request line and headers")
	errMalformed       = errors.New("validation error: malformed HTTP request")
)

// Codes of the guard's answers, beside the kernel API's.
const (
	CodeUnsupportedMedia = "UNSUPPORTED_MEDIA_TYPE"
	CodeForeignOrigin    = "FORBIDDEN_ORIGIN"
	CodeHostNotAllowed   = "HOST_NOT_ALLOWED"
	CodeTimeout          = "REQUEST_TIMEOUT"
	CodeHeadersTooLarge  = "HEADERS_TOO_LARGE"
)

// guardError is an answer of the request guard: its status and code.
type guardError struct {
	status int
	code   string
	err    error
}

func (e *guardError) Error() string { return e.err.Error() }
func (e *guardError) Unwrap() error { return e.err }

// headerReceived runs once a request's headers are in, before any of its
// body is read. The body then gets its own read deadline, and a request
// without a valid credential gets a write deadline too: only an
// authenticated stream may stay open without one.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	rc := fasthttp.RequestConfig{ReadTimeout: s.opts.ReadTimeout}
	if !s.auth.Open() {
		if _, err := s.auth.Authenticate(h.Peek("Authorization"), time.Now()); err != nil {
			rc.WriteTimeout = s.opts.WriteTimeout
			// fasthttp reads the first min(limit, 8 KiB) of a body before
			// the handler runs; for a request that will be refused
			// unread, one byte is enough.
			rc.MaxRequestBodySize = 1
		}
	}
	if h.ContentLength() > s.opts.MaxBodyBytes {
		rc.MaxRequestBodySize = 1
	}
	return rc
}

// readBody reads the request body, which fasthttp leaves streaming, up to
// limit bytes. A Content-Length over the limit is refused before a byte of
// the body is read; a chunked body is cut at the limit. Memory grows with
// what the client actually sent, never with what it announced.
func readBody(ctx *fasthttp.RequestCtx, limit int) error {
	n := ctx.Request.Header.ContentLength()
	if n == 0 || n == -2 {
		return nil
	}
	stream := ctx.RequestBodyStream()
	if stream == nil {
		return nil
	}
	if n > limit {
		// Refused unread; but a client still writing its body would see
		// the connection reset instead of the answer, so up to drainLimit
		// of it, arriving within drainTime, is read into nothing first.
		if n <= drainLimit {
			_ = ctx.Conn().SetReadDeadline(time.Now().Add(drainTime))
			_, _ = io.CopyN(io.Discard, stream, int64(n))
		}
		return errTooLarge
	}
	var (
		body []byte
		err  error
	)
	if n > 0 && n <= exactBody {
		// The common small body, which fasthttp has read ahead already:
		// one allocation of its size. (A bytes.Buffer grows before each
		// read and again to find the end: three.)
		body = make([]byte, n)
		_, err = io.ReadFull(stream, body)
	} else {
		var buf bytes.Buffer
		if n > 0 {
			buf.Grow(exactBody)
		}
		var read int64
		read, err = buf.ReadFrom(io.LimitReader(stream, int64(limit)+1))
		if err == nil && read > int64(limit) {
			return errTooLarge
		}
		body = buf.Bytes()
	}
	switch {
	case err != nil && isTimeout(err):
		return &guardError{fasthttp.StatusRequestTimeout, CodeTimeout, errReadTimedOut}
	case err != nil:
		return &guardError{fasthttp.StatusBadRequest, CodeValidation, errors.New("malformed request body: " + err.Error())}
	}
	if mt := ctx.Request.Header.ContentType(); len(mt) == 0 || bytes.Contains(mt, []byte("json")) {
		if err := checkJSONText(body); err != nil {
			return &guardError{fasthttp.StatusBadRequest, CodeValidation, err}
		}
	}
	ctx.Request.SetBodyRaw(body)
	return nil
}

// exactBody is the largest announced body read into a buffer of its exact
// size: what fasthttp reads ahead of the handler. A larger one is read
// into a buffer that grows with what arrives, so that a client that
// announces a megabyte and sends nothing costs no megabyte.
const exactBody = 8 << 10

// bodyUnread reports whether the request announced a body the handler
// path never read: the connection cannot carry another request then.
func bodyUnread(ctx *fasthttp.RequestCtx) bool {
	n := ctx.Request.Header.ContentLength()
	return n != 0 && n != -2 && ctx.RequestBodyStream() != nil
}

// checkMediaType refuses a state-changing request whose body is declared
// as something other than JSON (or msgpack): the bodies a browser may send
// another origin without asking first are text, forms and multipart, so
// this closes that door whatever the Origin header says. A body with no
// Content-Type at all is taken as JSON, as the kernel API always did: no
// browser sends one across origins without an Origin header, which
// checkOrigin judges.
func checkMediaType(ctx *fasthttp.RequestCtx, form bool) error {
	if ctx.IsGet() || ctx.IsHead() || ctx.IsOptions() {
		return nil
	}
	n := ctx.Request.Header.ContentLength()
	if n == 0 || n == -2 {
		return nil
	}
	ct := ctx.Request.Header.ContentType()
	if len(ct) == 0 {
		return nil
	}
	if string(ct) == "application/json" {
		// What nearly every request declares, and what the parse below
		// accepts: it would allocate its result and a map of parameters.
		return nil
	}
	mt, _, err := mime.ParseMediaType(string(ct))
	if err == nil && form && mt == "application/x-www-form-urlencoded" {
		return nil
	}
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json") ||
		mt == "application/msgpack" || mt == "application/x-msgpack" || mt == "application/vnd.msgpack") {
		return nil
	}
	return &guardError{fasthttp.StatusUnsupportedMediaType, CodeUnsupportedMedia, errMediaType}
}

// checkOrigin refuses what a browser sends on behalf of a page of another
// origin, unless --cors-origins lists it. Browsers say where a request
// comes from in Sec-Fetch-Site (all current ones) or Origin (older ones on
// cross-origin requests); clients that are not browsers send neither. A
// top-level navigation (a person following a link to /ui/) is let through:
// it cannot read or change anything by itself.
func (s *Server) checkOrigin(ctx *fasthttp.RequestCtx) error {
	h := &ctx.Request.Header
	origin := string(h.Peek("Origin"))
	switch string(h.Peek("Sec-Fetch-Site")) {
	case "same-origin", "none":
		return nil
	case "":
		if origin == "" || s.sameOrigin(ctx, origin) {
			return nil
		}
	default:
		if (ctx.IsGet() || ctx.IsHead()) && string(h.Peek("Sec-Fetch-Mode")) == "navigate" {
			return nil
		}
	}
	if origin != "" && s.trustedOrigin(origin) {
		return nil
	}
	return &guardError{fasthttp.StatusForbidden, CodeForeignOrigin, errForeignOrigin}
}

// sameOrigin reports whether origin names the host the request was sent to.
func (s *Server) sameOrigin(ctx *fasthttp.RequestCtx, origin string) bool {
	_, rest, ok := strings.Cut(origin, "://")
	return ok && strings.EqualFold(rest, string(ctx.Host()))
}

func (s *Server) trustedOrigin(origin string) bool {
	for _, o := range s.opts.CORSOrigins {
		if o == "*" || strings.EqualFold(o, origin) {
			return true
		}
	}
	return false
}

// checkHost refuses, on a gateway with no token, a Host that is neither a
// loopback name nor listed: a page whose DNS name was rebound to 127.0.0.1
// is same-origin with itself, and only the Host it sends gives it away.
func (s *Server) checkHost(ctx *fasthttp.RequestCtx) error {
	if !s.auth.Open() {
		return nil
	}
	if plainLoopback(ctx.Host()) {
		return nil
	}
	host := hostName(string(ctx.Host()))
	if loopbackName(host) {
		return nil
	}
	for _, allowed := range s.opts.AllowedHosts {
		if strings.EqualFold(allowed, host) {
			return nil
		}
	}
	return &guardError{fasthttp.StatusMisdirectedRequest, CodeHostNotAllowed, errHostNotAllowed}
}

// plainLoopback reports whether host is "localhost" or "127.0.0.1", with
// a port or without, the Host of nearly every request to a gateway with no
// token: such a Host is a loopback name for hostName and loopbackName too,
// which would take a string of it (an allocation) to say so. Anything else,
// any case, bracket or second colon included, is theirs to judge.
func plainLoopback(host []byte) bool {
	name, port, _ := bytes.Cut(host, []byte(":"))
	if bytes.ContainsAny(port, ":[]") {
		return false
	}
	return string(name) == "localhost" || string(name) == "127.0.0.1"
}

// LoopbackHost reports whether host, a request's Host header with or
// without its port, names this machine's loopback interface: localhost, a
// name under .localhost, or a loopback address. Anything else may be a
// DNS name rebound to 127.0.0.1 by a page in a browser.
func LoopbackHost(host string) bool { return loopbackName(hostName(host)) }

// hostName is the name a Host header gives: without its port or a final
// dot, in lower case.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// loopbackName reports whether a host name (see hostName) is localhost, a
// name under .localhost, or a loopback address.
func loopbackName(name string) bool {
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(strings.Trim(name, "[]"))
	return err == nil && a.Unmap().IsLoopback()
}

// Errors of checkJSONText.
var (
	errNotUTF8       = errors.New("validation error: the body is not valid UTF-8")
	errNumberTooLong = errors.New("validation error: a number in the body is out of range")
	errLoneSurrogate = errors.New(`validation error: a \u escape in the body is half of a surrogate pair`)
)

// checkJSONText refuses JSON text that Go's decoder would take with a
// silent change: invalid UTF-8 and \u escapes of half a surrogate pair
// (both become U+FFFD in strings; RFC 8259 §8.2 leaves them to the
// receiver) and numbers beyond float64 (1e999999, which a stored value
// would echo but no projection could read). One pass over the bytes; it
// does not validate the JSON itself, which its decoder does.
func checkJSONText(data []byte) error {
	if !utf8.Valid(data) {
		return errNotUTF8
	}
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
				if c == 'u' {
					n, ok := surrogateEscape(data[i+1:])
					if !ok {
						return errLoneSurrogate
					}
					i += n
				}
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			exp := false
			for j < len(data) && strings.IndexByte("0123456789+-.eE", data[j]) >= 0 {
				exp = exp || data[j] == 'e' || data[j] == 'E'
				j++
			}
			// Only an exponent or 300-odd digits leave float64's range.
			if exp || j-i > 300 {
				if _, err := strconv.ParseFloat(string(data[i:j]), 64); err != nil {
					return errNumberTooLong
				}
			}
			i = j - 1
		}
	}
	return nil
}

// surrogateEscape reads what follows a \u: four hex digits, and when they
// are a high surrogate, the \u escape of the low one that must follow. It
// returns how many bytes it read, and false for half a pair. Anything that
// is not hex is left to the decoder.
func surrogateEscape(b []byte) (int, bool) {
	r, ok := hex4(b)
	switch {
	case !ok || r < 0xd800 || r > 0xdfff:
		return 0, true
	case r >= 0xdc00 || len(b) < 10 || b[4] != '\\' || b[5] != 'u':
		return 0, false
	}
	lo, ok := hex4(b[6:])
	return 10, ok && lo >= 0xdc00 && lo <= 0xdfff
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
