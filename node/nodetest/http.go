package nodetest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Do sends one request to a test's server with hc (nil: the default
// client) and returns the answer's status, body and header. A string or
// []byte body is sent as it is, any other non-nil body as JSON; hdr are
// header name and value pairs, "Host" included. A request that gets no
// answer fails the test.
func Do(tb testing.TB, hc *http.Client, method, url string, body any, hdr ...string) (int, []byte, http.Header) {
	tb.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			tb.Fatalf("nodetest: %s %s: %v", method, url, err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(tb.Context(), method, url, r)
	if err != nil {
		tb.Fatalf("nodetest: %s %s: %v", method, url, err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		// net/http sends req.Host, not a Host header.
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read: %v", method, url, err)
	}
	return resp.StatusCode, data, resp.Header
}

// Object checks an answer to method url: its status must be want and its
// body a JSON object, which it returns (nil for the empty body of a 204).
func Object(tb testing.TB, method, url string, status int, data []byte, want int) map[string]any {
	tb.Helper()
	if status != want {
		tb.Fatalf("%s %s: status %d, want %d; body %s", method, url, status, want, data)
	}
	if len(data) == 0 && status == http.StatusNoContent {
		return nil
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		tb.Fatalf("%s %s: body is not a JSON object: %v: %s", method, url, err, data)
	}
	return out
}
