// Package client is a Go SDK for the Gatehouse kernel API (/v0, HTTP and
// Server-Sent Events): an API client for executions, plus the two long-lived
// roles, [Runner] (runs tools for the kernel) and [Agent] (drives
// executions).
//
// Every call takes a context. Calls that are safe to repeat (reads, cancel,
// step and job results, intents, which carry idempotency keys) are retried
// on network errors and 5xx answers with jittered exponential backoff; a 429
// is retried after its Retry-After. Streams reconnect the same way and
// resume where they stopped. Given several gateways of one cluster
// (Options.BaseURLs), the client moves to the next one whenever the one it
// uses cannot be reached, and its streams resume there from their cursors.
// A gateway certificate that is not trusted
// (*tls.CertificateVerificationError) is never retried: trust its CA
// through Options.TLSConfig. Non-2xx answers are returned as *[APIError],
// which matches the sentinel of its code (errors.Is(err, ErrNotFound)).
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Client. BaseURL or BaseURLs is required.
type Options struct {
	// BaseURL is the gateway's address, e.g. "http://127.0.0.1:8080". The
	// kernel API's "/v0" at its end, which the routes add themselves, is
	// dropped: "http://127.0.0.1:8080/v0" names the same gateway.
	BaseURL string
	// BaseURLs are more gateways serving the same facts (the nodes of one
	// cluster), in the order they are tried after BaseURL, which may be
	// left empty. Requests and streams go to one gateway at a time; when it
	// cannot be reached (the connection is refused or lost, or it answers
	// 502, 503 or 504), the client moves on to the next, round the list,
	// with the same jittered backoff as any retry. A stream resumes on the
	// next gateway from its cursor (the last sequence, the Last-Event-ID),
	// so nothing is missed or handed over twice. A request that never
	// reached a gateway (its connection was refused) is sent to the next
	// one even when it is not safe to repeat.
	BaseURLs []string
	// Token is sent as "Authorization: Bearer <Token>" when set.
	Token string
	// HTTPClient carries every request. Leave its Timeout zero: it would cut
	// long-lived streams; the Client bounds ordinary requests itself. Nil
	// uses a client whose transport keeps up to 64 idle connections to the
	// gateway, enough for busy agents and runners.
	HTTPClient *http.Client
	// TLSConfig is used by that default client for https:// gateways, e.g.
	// to trust a private CA (RootCAs); nil uses the system's roots. It is
	// ignored when HTTPClient is set.
	TLSConfig *tls.Config
	// Logger receives reconnects and dropped deliveries; nil discards.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the jittered exponential backoff of
	// retries and reconnects; zero means 200ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// RequestTimeout bounds each attempt of an ordinary request; zero means
	// 35s. Streams have no timeout.
	RequestTimeout time.Duration
	// StreamIdleTimeout ends a stream that received nothing (not even a
	// heartbeat) for this long, so a silently dead connection is noticed
	// and replaced; zero means 45s, three times the longest heartbeat
	// interval a gateway may use.
	StreamIdleTimeout time.Duration
}

// maxAttempts bounds the tries of one retried request.
const maxAttempts = 5

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 1 << 20

// Client talks to a gateway, or to the next of its list when that one
// cannot be reached. It is safe for concurrent use.
type Client struct {
	bases   []string      // scheme://host[/prefix], without a trailing slash
	cur     atomic.Uint32 // index in bases of the gateway in use
	hdr     headers
	bufs    sync.Pool // of *bytes.Buffer
	hc      *http.Client
	log     *slog.Logger
	min     time.Duration
	max     time.Duration
	timeout time.Duration
	idle    time.Duration
}

// ErrNoBaseURL is returned by New when Options name no gateway.
var ErrNoBaseURL = errors.New("client: no base URL")

// maxBaseURLs bounds Options' list of gateways.
const maxBaseURLs = 64

// New returns a Client for o.BaseURL and o.BaseURLs.
func New(o Options) (*Client, error) {
	urls := o.BaseURLs
	if o.BaseURL != "" {
		urls = append([]string{o.BaseURL}, urls...)
	}
	if len(urls) == 0 {
		return nil, ErrNoBaseURL
	}
	if len(urls) > maxBaseURLs {
		return nil, fmt.Errorf("client: %d base URLs; at most %d", len(urls), maxBaseURLs)
	}
	bases := make([]string, len(urls))
	for i, raw := range urls {
		b, err := parseBase(raw)
		if err != nil {
			return nil, err
		}
		bases[i] = b
	}
	c := &Client{bases: bases, hc: o.HTTPClient, log: o.Logger,
		min: o.MinBackoff, max: o.MaxBackoff, timeout: o.RequestTimeout, idle: o.StreamIdleTimeout}
	c.hdr = headers{userAgent: []string{"gatehouse-go-client"}, contentType: []string{"application/json"}}
	if o.Token != "" {
		c.hdr.auth = []string{"Bearer " + o.Token}
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: newTransport(o.TLSConfig)}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.min <= 0 {
		c.min = 200 * time.Millisecond
	}
	if c.max <= 0 {
		c.max = 10 * time.Second
	}
	if c.max < c.min {
		c.max = c.min
	}
	if c.timeout <= 0 {
		c.timeout = 35 * time.Second
	}
	if c.idle <= 0 {
		c.idle = 45 * time.Second
	}
	return c, nil
}

// parseBase checks one gateway's base URL and returns it without a trailing
// slash, "/v0", query or fragment.
func parseBase(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSuffix(strings.TrimRight(raw, "/"), "/v0"))
	if err != nil {
		return "", fmt.Errorf("client: base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("client: base URL %q: want http(s)://host[:port]", raw)
	}
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}

// BaseURL returns the base URL of the gateway the client uses now.
func (c *Client) BaseURL() string { return c.bases[c.target()] }

// target is the index in c.bases of the gateway to send to.
func (c *Client) target() int { return int(c.cur.Load()) }

// failover moves the client off gateway i, which could not be reached,
// to the next in its list. Many requests and streams notice the loss of
// one gateway at once: only the first moves the client, so that the list
// is not skipped through.
func (c *Client) failover(i int, err error) {
	if len(c.bases) == 1 {
		return
	}
	next := (i + 1) % len(c.bases)
	if c.cur.CompareAndSwap(uint32(i), uint32(next)) {
		c.log.Info("gateway unreachable; moving to the next", "from", c.bases[i], "to", c.bases[next], "err", err)
	}
}

// unreachable reports whether an answer's status says the gateway is not
// there to serve (a proxy in front of a dead node, or a node shutting down
// or full of connections), rather than refusing the request itself.
func unreachable(status int) bool {
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// neverSent reports whether a request failed before reaching any gateway:
// its connection was not made. Sending it elsewhere cannot repeat it.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// CloseIdleConnections closes the connections kept open for reuse. Call it
// when done with the Client, so that the gateway is not left holding them.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

func newTransport(tc *tls.Config) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		TLSClientConfig:       tc.Clone(),
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// The gateway answers uncompressed; asking for gzip would only add
		// a header to every request and a check to every answer.
		DisableCompression: true,
	}
}

// call describes one request.
type call struct {
	method string
	path   string     // below BaseURL, already escaped
	query  url.Values // may be nil
	body   any        // marshalled as JSON when non-nil
	retry  bool       // safe to repeat on network errors and 5xx
}

// list GETs one page of a /v0 list at path, filtered by q, after cursor
// and of limit entries (the server's default when zero), into out.
func (c *Client) list(ctx context.Context, path string, q url.Values, cursor string, limit int, out any) error {
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return c.do(ctx, call{method: http.MethodGet, path: path, query: q, retry: true}, out)
}

// do performs c and decodes a JSON answer into out (unless out is nil).
func (c *Client) do(ctx context.Context, cl call, out any) error {
	var body []byte
	if cl.body != nil {
		// Not a pooled buffer: net/http may still be sending the body after
		// the answer came (the gateway refuses some bodies before reading
		// them), so it cannot be handed to the next request.
		var err error
		if body, err = json.Marshal(cl.body); err != nil {
			return fmt.Errorf("client: %s %s: encode body: %w", cl.method, cl.path, err)
		}
	}
	b := c.backoff()
	// Every gateway of the list gets its try.
	attempts := max(maxAttempts, len(c.bases))
	for attempt := 1; ; attempt++ {
		wait, err := c.attempt(ctx, cl, body, out)
		if err == nil {
			return nil
		}
		if wait < 0 || attempt == attempts || ctx.Err() != nil {
			return err
		}
		if wait == 0 {
			wait = b.next()
		}
		c.log.Debug("retrying request", "method", cl.method, "path", cl.path, "attempt", attempt, "in", wait, "err", err)
		if sleep(ctx, wait) != nil {
			return err
		}
	}
}

// attempt makes one try. A failure says how long to wait before the next
// one: a negative wait means do not retry, zero means the usual backoff.
func (c *Client) attempt(parent context.Context, cl call, body []byte, out any) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(parent, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	gw := c.target()
	req, err := http.NewRequestWithContext(ctx, cl.method, c.url(gw, cl.path, cl.query), rd)
	if err != nil {
		return -1, fmt.Errorf("client: %s %s: %w", cl.method, cl.path, err)
	}
	c.header(req)
	if body != nil {
		req.Header["Content-Type"] = c.hdr.contentType
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		err = fmt.Errorf("client: %s %s: %w", cl.method, cl.path, err)
		if untrusted(err) {
			return -1, err
		}
		if parent.Err() == nil {
			// Not the caller giving up: the gateway is gone, or did not
			// answer within RequestTimeout.
			c.failover(gw, err)
		}
		if cl.retry || len(c.bases) > 1 && neverSent(err) {
			return 0, err
		}
		return -1, err
	}
	defer drain(resp.Body)
	if resp.StatusCode/100 != 2 {
		aerr := readAPIError(resp)
		if unreachable(resp.StatusCode) {
			c.failover(gw, aerr)
		}
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			return retryAfter(resp.Header.Get("Retry-After")), aerr
		case cl.retry && resp.StatusCode >= 500:
			return 0, aerr
		}
		return -1, aerr
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return 0, nil
	}
	buf := c.getBuffer()
	defer c.putBuffer(buf)
	_, err = buf.ReadFrom(resp.Body)
	if err == nil {
		err = json.Unmarshal(buf.Bytes(), out)
	}
	if err != nil {
		err = fmt.Errorf("client: %s %s: read answer: %w", cl.method, cl.path, err)
		if cl.retry {
			return 0, err
		}
		return -1, err
	}
	return 0, nil
}

// maxPooledBuffer is the largest buffer given back to the pool; a rare
// large body is left to the garbage collector rather than kept.
const maxPooledBuffer = 64 << 10

// getBuffer lends a buffer for an answer, so that a busy agent or runner
// does not allocate one anew for each request.
func (c *Client) getBuffer() *bytes.Buffer {
	if b, ok := c.bufs.Get().(*bytes.Buffer); ok {
		return b
	}
	return new(bytes.Buffer)
}

func (c *Client) putBuffer(b *bytes.Buffer) {
	if b.Cap() > maxPooledBuffer {
		return
	}
	b.Reset()
	c.bufs.Put(b)
}

// retryAfter reads a Retry-After header in seconds; the kernel API's clients
// wait one second when it is missing.
func retryAfter(h string) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return time.Duration(n)*time.Second + time.Millisecond
	}
	return time.Second
}

func readAPIError(resp *http.Response) *APIError {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{Status: resp.StatusCode}
	var body struct {
		Error   string          `json:"error"`
		Message string          `json:"message"`
		Code    string          `json:"code"`
		Details json.RawMessage `json:"details"`
	}
	if json.Unmarshal(data, &body) == nil && (body.Error != "" || body.Code != "" || body.Message != "") {
		e.Code, e.Message = body.Code, body.Error
		if e.Message == "" {
			e.Message = body.Message
		}
		if len(body.Details) > 0 && string(body.Details) != "null" {
			e.Details = body.Details
		}
		return e
	}
	e.Message = strings.TrimSpace(string(data))
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// url joins the base URL of gateway gw and an already escaped path.
func (c *Client) url(gw int, path string, q url.Values) string {
	s := c.bases[gw] + path
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// header sets the headers every request carries.
func (c *Client) header(req *http.Request) {
	req.Header["User-Agent"] = c.hdr.userAgent
	if c.hdr.auth != nil {
		req.Header["Authorization"] = c.hdr.auth
	}
}

// headers are header values shared by all of a Client's requests, made
// once rather than for each request; net/http only reads them.
type headers struct {
	userAgent, contentType []string
	auth                   []string // nil without a token
}

// drain reads what is left of a body so the connection can be reused.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	_ = body.Close()
}

// backoff is a jittered exponential backoff: each wait is drawn from
// [d/2, d], where d doubles from min up to max, so that many clients that
// lost the same server do not come back in lockstep.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (c *Client) backoff() *backoff { return &backoff{min: c.min, max: c.max} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else if b.cur *= 2; b.cur > b.max {
		b.cur = b.max
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
