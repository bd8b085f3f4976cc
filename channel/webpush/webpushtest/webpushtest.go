// Package webpushtest runs an independent push service for the Web Push
// channel's tests: the npm package web-push-testing (Version), a push
// service written against RFC 8030, 8291 and 8292 by others, which checks
// the VAPID signature and key of each message, decrypts it and keeps it
// for the test to read. Between the channel and it sits a recording proxy
// on 127.0.0.1, so that a test also sees the headers each push carried
// (TTL, Topic, Urgency, Authorization).
//
// The package is looked for in $GATEHOUSE_WEB_PUSH_TESTING (the package's
// folder), then in the user's cache (<cache>/gatehouse/web-push-testing@
// <Version>), where it is installed with npm on first use:
//
//	npm install --prefix "${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse/web-push-testing@1.2.2" \
//	    --no-audit --no-fund web-push-testing@1.2.2
//
// Without node (or, to install, npm) the test is skipped, saying so; with
// CI set in the environment it fails instead.
package webpushtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
)

// Version is the web-push-testing release the tests run.
const Version = "1.2.2"

// Service is a running web-push-testing behind a recording proxy.
type Service struct {
	// URL is web-push-testing's own base URL.
	URL   string
	proxy *httptest.Server

	mu       sync.Mutex
	requests []Request
}

// Request is one push the service received, as the proxy saw it.
type Request struct {
	// Client is the subscription's client hash.
	Client string
	Header http.Header
	// Status is what web-push-testing answered: 201 when it verified and
	// decrypted the message.
	Status int
	Answer string
	// At is when the push reached the proxy.
	At time.Time
}

// arrival is the context key of a push's arrival time.
type arrival struct{}

// Subscription is a subscription of the service's: the PushSubscription
// JSON a browser would give (its endpoint the proxy's), and its client
// hash.
type Subscription struct {
	Endpoint string `json:"endpoint"`
	Keys     struct {
		P256dh string `json:"p256dh"`
		Auth   string `json:"auth"`
	} `json:"keys"`
	ClientHash string `json:"-"`
}

// JSON is the subscription as the browser's toJSON gives it.
func (s Subscription) JSON() json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// need skips the test, or fails it under CI, for a missing tool.
func need(tb testing.TB, what string) {
	tb.Helper()
	msg := what + ": the Web Push tests run the npm package web-push-testing " + Version +
		" (install Debian's nodejs and npm; .ci/run installs them and the package)"
	if os.Getenv("CI") != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// dir returns web-push-testing's folder, installing it on first use.
func dir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv("GATEHOUSE_WEB_PUSH_TESTING"); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		need(tb, "no cache folder to install into ("+err.Error()+")")
	}
	root := filepath.Join(cache, "gatehouse", "web-push-testing@"+Version)
	pkg := filepath.Join(root, "node_modules", "web-push-testing")
	if _, err := os.Stat(filepath.Join(pkg, "src", "bin", "server.js")); err == nil {
		return pkg
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		need(tb, "npm is not installed")
	}
	// Installed beside and renamed into place, so that test binaries
	// running at once never see half a package.
	tmp, err := os.MkdirTemp(filepath.Dir(root), "install-")
	if err != nil && os.MkdirAll(filepath.Dir(root), 0o755) == nil {
		tmp, err = os.MkdirTemp(filepath.Dir(root), "install-")
	}
	if err != nil {
		tb.Fatalf("webpushtest: %v", err)
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, npm, "install", "--prefix", tmp, "--no-audit", "--no-fund", "web-push-testing@"+Version).CombinedOutput()
	if err != nil {
		tb.Fatalf("webpushtest: npm install web-push-testing@%s: %v\n%s", Version, err, out)
	}
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(filepath.Join(pkg, "src", "bin", "server.js")); serr != nil {
			tb.Fatalf("webpushtest: %v", err)
		}
	}
	return pkg
}

// Start runs web-push-testing and its proxy until the test ends.
func Start(tb testing.TB) *Service {
	tb.Helper()
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		need(tb, "node is not installed")
	}
	server := filepath.Join(dir(tb), "src", "bin", "server.js")
	var port int
	for attempt := 1; ; attempt++ {
		if port, err = run(tb, nodeBin, server); err == nil {
			break
		} else if attempt == 3 {
			tb.Fatalf("webpushtest: web-push-testing did not start: %v", err)
		}
	}
	s := &Service{URL: "http://localhost:" + strconv.Itoa(port)}
	target, _ := url.Parse(s.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		at, _ := resp.Request.Context().Value(arrival{}).(time.Time)
		s.requests = append(s.requests, Request{Client: strings.TrimPrefix(resp.Request.URL.Path, "/notify/"),
			Header: resp.Request.Header.Clone(), Status: resp.StatusCode, Answer: string(body), At: at})
		s.mu.Unlock()
		return nil
	}
	s.proxy = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), arrival{}, time.Now())))
	}))
	tb.Cleanup(s.proxy.Close)
	return s
}

// run starts the server on a free port and waits until it listens.
func run(tb testing.TB, nodeBin, server string) (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(nodeBin, server, strconv.Itoa(port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		started := false
		for sc.Scan() {
			if !started && strings.Contains(sc.Text(), "Server running on port") {
				started = true
				ready <- true
			}
		}
		if !started {
			ready <- false
		}
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	select {
	case ok := <-ready:
		if !ok {
			stop()
			return 0, fmt.Errorf("exited: %s", stderr.String())
		}
	case <-time.After(30 * time.Second):
		stop()
		return 0, fmt.Errorf("no word within 30s: %s", stderr.String())
	}
	tb.Cleanup(stop)
	return port, nil
}

// call posts body as JSON to the service's path and decodes its answer's
// data into v.
func (s *Service) call(tb testing.TB, path string, body, v any) {
	tb.Helper()
	raw, _ := json.Marshal(body)
	resp, err := http.Post(s.URL+path, "application/json", bytes.NewReader(raw))
	if err != nil {
		tb.Fatalf("webpushtest: %s: %v", path, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("webpushtest: %s: %s %s", path, resp.Status, answer)
	}
	if v == nil {
		return
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(answer, &env); err != nil || json.Unmarshal(env.Data, v) != nil {
		tb.Fatalf("webpushtest: %s answered %s", path, answer)
	}
}

// Subscribe makes a subscription for applicationServerKey (base64url), as
// a browser's pushManager.subscribe would; its endpoint is the proxy's.
func (s *Service) Subscribe(tb testing.TB, applicationServerKey string) Subscription {
	tb.Helper()
	var sub struct {
		Subscription
		ClientHash string `json:"clientHash"`
	}
	s.call(tb, "/subscribe", map[string]string{"applicationServerKey": applicationServerKey, "userVisibleOnly": "true"}, &sub)
	sub.Subscription.ClientHash = sub.ClientHash
	sub.Subscription.Endpoint = s.proxy.URL + "/notify/" + sub.ClientHash
	return sub.Subscription
}

// Origin is the proxy's origin: a VAPID token's audience.
func (s *Service) Origin() string { return s.proxy.URL }

// Messages returns the messages the service decrypted for a subscription.
func (s *Service) Messages(tb testing.TB, sub Subscription) []string {
	tb.Helper()
	var got struct {
		Messages []string `json:"messages"`
	}
	s.call(tb, "/get-notifications", map[string]string{"clientHash": sub.ClientHash}, &got)
	return got.Messages
}

// WaitMessages waits until the service holds n messages for sub and
// returns them.
func (s *Service) WaitMessages(tb testing.TB, sub Subscription, n int) []string {
	tb.Helper()
	return eventually.Value(tb, strconv.Itoa(n)+" push messages", func() ([]string, bool) {
		m := s.Messages(tb, sub)
		return m, len(m) >= n
	})
}

// Expire makes sub answer 410 Gone from now on, as a push service does
// for a subscription the browser dropped.
func (s *Service) Expire(tb testing.TB, sub Subscription) {
	tb.Helper()
	s.call(tb, "/expire-subscription/"+sub.ClientHash, map[string]string{}, nil)
}

// WaitRequests waits until the proxy has seen n pushes to sub (it records
// one once the service has answered it) and returns them.
func (s *Service) WaitRequests(tb testing.TB, sub Subscription, n int) []Request {
	tb.Helper()
	return eventually.Value(tb, strconv.Itoa(n)+" pushes seen", func() ([]Request, bool) {
		r := s.Requests(sub)
		return r, len(r) >= n
	})
}

// Requests returns the pushes to sub the proxy saw.
func (s *Service) Requests(sub Subscription) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	for _, r := range s.requests {
		if r.Client == sub.ClientHash {
			out = append(out, r)
		}
	}
	return out
}
