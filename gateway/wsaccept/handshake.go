package wsaccept

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/valyala/fasthttp"
)

// requestHeader copies the request headers into canonical net/http form.
// Working on the copy also keeps the checks independent of fasthttp's
// DisableHeaderNamesNormalizing.
func requestHeader(h *fasthttp.RequestHeader) http.Header {
	hdr := make(http.Header)
	for k, v := range h.All() {
		key := http.CanonicalHeaderKey(string(k))
		if key == "Host" {
			continue // net/http keeps it in Request.Host only
		}
		hdr[key] = append(hdr[key], string(v))
	}
	return hdr
}

// checkUpgrade returns the status and reason to refuse the request with, or
// 0 if it is a WebSocket opening handshake (RFC 6455 section 4.2.1).
func checkUpgrade(ctx *fasthttp.RequestCtx, hdr http.Header) (int, string) {
	if !hasToken(hdr, "Connection", "upgrade") || !hasToken(hdr, "Upgrade", "websocket") {
		return fasthttp.StatusUpgradeRequired, "this endpoint only speaks WebSocket"
	}
	if !ctx.IsGet() {
		return fasthttp.StatusMethodNotAllowed, "a WebSocket handshake must use GET"
	}
	if !ctx.Request.Header.IsHTTP11() {
		return fasthttp.StatusBadRequest, "a WebSocket handshake needs HTTP/1.1"
	}
	if v := hdr.Values("Sec-WebSocket-Version"); len(v) != 1 || strings.TrimSpace(v[0]) != "13" {
		return fasthttp.StatusUpgradeRequired, "unsupported Sec-WebSocket-Version, only 13 is supported"
	}
	keys := hdr.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return fasthttp.StatusBadRequest, "expected exactly one Sec-WebSocket-Key"
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return fasthttp.StatusBadRequest, "Sec-WebSocket-Key must be 16 bytes in base64"
	}
	return 0, ""
}

func hasToken(hdr http.Header, key, token string) bool {
	for _, v := range hdr.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// refuse answers a request that is not an acceptable handshake, with the
// headers RFC 6455 and RFC 9110 ask for so a client can tell what to fix.
func refuse(ctx *fasthttp.RequestCtx, status int, reason string) {
	ctx.Error(reason, status)
	switch status {
	case fasthttp.StatusUpgradeRequired:
		ctx.Response.Header.Set("Upgrade", "websocket")
		ctx.Response.Header.Set("Connection", "Upgrade")
		ctx.Response.Header.Set("Sec-WebSocket-Version", "13")
	case fasthttp.StatusMethodNotAllowed:
		ctx.Response.Header.Set("Allow", fasthttp.MethodGet)
	}
}

// newRequest builds what websocket.Accept reads: the method and protocol
// (already checked), the headers, and Host, which the Origin check compares
// against. Everything is copied, as fasthttp reuses ctx after the handler.
func newRequest(ctx *fasthttp.RequestCtx, hdr http.Header) (*http.Request, error) {
	uri := string(ctx.RequestURI())
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, fmt.Errorf("parse request URI: %w", err)
	}
	return &http.Request{
		Method:     http.MethodGet,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     hdr,
		Body:       http.NoBody,
		Host:       string(ctx.Host()),
		RemoteAddr: ctx.RemoteAddr().String(),
		RequestURI: uri,
	}, nil
}

// responseWriter records what websocket.Accept answers. A refusal is replayed
// through fasthttp; a 101 is written to the socket once fasthttp hijacks it.
type responseWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	nc     *conn
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

// Sizes of the buffers websocket.Conn reads and writes through. They live
// as long as the socket, idle or not, so they are kept small: reads go
// through fasthttp's own buffered reader already, and a frame larger than
// the write buffer only costs one more write.
const (
	readBufferSize  = 256
	writeBufferSize = 1024
)

// Hijack hands out a conn that is not attached to a socket yet: fasthttp
// releases the socket only after the request handler has returned, and
// websocket.Accept does no I/O on the conn before then.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.nc = &conn{}
	rw := bufio.NewReadWriter(bufio.NewReaderSize(w.nc, readBufferSize), bufio.NewWriterSize(w.nc, writeBufferSize))
	return w.nc, rw, nil
}

// head returns the recorded status line and header block.
func (w *responseWriter) head() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", w.status, http.StatusText(w.status))
	_ = w.header.Write(&b) // a bytes.Buffer does not fail
	b.WriteString("\r\n")
	return b.Bytes()
}

// replay copies a recorded refusal into resp.
func (w *responseWriter) replay(resp *fasthttp.Response) {
	resp.Reset()
	resp.SetStatusCode(w.status)
	for k, vs := range w.header {
		for _, v := range vs {
			resp.Header.Add(k, v)
		}
	}
	resp.SetBody(w.body.Bytes())
}
