package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// response is a fully read HTTP answer.
type response struct {
	method, path string
	status       int
	header       http.Header
	body         []byte
}

// String describes the exchange for failure messages, with the body
// shortened so one reason stays readable.
func (r *response) String() string {
	b := strings.TrimSpace(string(r.body))
	if len(b) > 300 {
		b = b[:300] + "…"
	}
	return fmt.Sprintf("%s %s → %d %s", r.method, r.path, r.status, b)
}

// reqOpt adjusts one request.
type reqOpt func(*http.Request)

// header sets a request header.
func header(k, v string) reqOpt { return func(r *http.Request) { r.Header.Set(k, v) } }

// noAuth sends the request without credentials.
func noAuth() reqOpt { return func(r *http.Request) { r.Header.Del("Authorization") } }

// bearer sends the request with another token.
func bearer(tok string) reqOpt {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

// rawBody marks a body to send as is rather than encode as JSON.
type rawBody string

// newRequest builds a request; body is JSON-encoded unless it is a rawBody.
func (t *tc) newRequest(ctx context.Context, method, path string, body any, opts []reqOpt) *http.Request {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case rawBody:
		rd = strings.NewReader(string(b))
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.fatalf("encode request body: %v", err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, t.o.URL+path, rd)
	if err != nil {
		t.fatalf("request %s %s: %v", method, path, err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if t.o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+t.o.Token)
	}
	for _, o := range opts {
		o(req)
	}
	return req
}

// call sends one request and reads the whole answer. A transport error ends
// the check: every endpoint must answer.
func (t *tc) call(method, path string, body any, opts ...reqOpt) *response {
	ctx, cancel := t.within(15 * time.Second)
	defer cancel()
	req := t.newRequest(ctx, method, path, body, opts)
	resp, err := t.o.HTTPClient.Do(req)
	if err != nil {
		t.fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		t.fatalf("%s %s: read body: %v", method, path, err)
	}
	return &response{method: method, path: path, status: resp.StatusCode, header: resp.Header, body: data}
}

// expect fails unless the answer has the status.
func (t *tc) expect(r *response, status int) {
	if r.status != status {
		t.fatalf("want %d: %s", status, r)
	}
}

// expectJSON fails unless the answer has the status and is a JSON object,
// which it returns.
func (t *tc) expectJSON(r *response, status int) obj {
	t.expect(r, status)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.fatalf("Content-Type %q, want application/json: %s", ct, r)
	}
	return t.object(r)
}

// expectError fails unless the answer is the kernel API's JSON error with
// the status and machine code: {"error": non-empty string, "code": code}.
func (t *tc) expectError(r *response, status int, code string) obj {
	o := t.expectJSON(r, status)
	if msg, ok := o.str("error"); !ok || msg == "" {
		t.fatalf(`error body lacks a non-empty "error" string: %s`, r)
	}
	if got, _ := o.str("code"); got != code {
		t.fatalf("error code %q, want %q: %s", got, code, r)
	}
	return o
}

// object decodes the body as a JSON object.
func (t *tc) object(r *response) obj {
	var o obj
	if err := json.Unmarshal(r.body, &o); err != nil || o == nil {
		t.fatalf("body is not a JSON object (%v): %s", err, r)
	}
	return o
}

// decode decodes the body into v.
func (t *tc) decode(r *response, v any) {
	if err := json.Unmarshal(r.body, v); err != nil {
		t.fatalf("decode body: %v: %s", err, r)
	}
}

// obj is a JSON object with its values undecoded, so that shape checks can
// tell an absent key from null.
type obj map[string]json.RawMessage

// String renders the object as JSON, so that a failure's reason that
// prints one (with %v or %s) shows the text, not the bytes of each value.
func (o obj) String() string { return show(map[string]json.RawMessage(o)) }

func (o obj) has(k string) bool { _, ok := o[k]; return ok }

// str returns a string value; ok is false when the key is absent or not a
// string.
func (o obj) str(k string) (string, bool) {
	raw, ok := o[k]
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// num returns a numeric value.
func (o obj) num(k string) (float64, bool) {
	raw, ok := o[k]
	if !ok {
		return 0, false
	}
	var n float64
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	return n, true
}

// boolean returns a boolean value.
func (o obj) boolean(k string) (bool, bool) {
	raw, ok := o[k]
	if !ok {
		return false, false
	}
	var b bool
	if json.Unmarshal(raw, &b) != nil {
		return false, false
	}
	return b, true
}

// sub returns a nested object, nil when absent or not an object.
func (o obj) sub(k string) obj {
	var s obj
	if raw, ok := o[k]; ok {
		_ = json.Unmarshal(raw, &s)
	}
	return s
}

// isNull reports whether the key is present with the value null.
func (o obj) isNull(k string) bool {
	raw, ok := o[k]
	return ok && strings.TrimSpace(string(raw)) == "null"
}

// needAllowed skips the check when r is the server's policy refusing tool,
// which the check needs to run: an intent answered accepted:false, or a
// Runtime API invocation that failed, with an error "policy denied: ...".
// A policy may deny any tool, so a gateway started with one that allows a
// few tools only (an example policy) cannot run the check, which is no
// failure of the server; the skip says which tool and why. Any other
// answer is left to the check.
func (t *tc) needAllowed(tool string, r *response) {
	if r.status != http.StatusOK {
		return
	}
	var o obj
	if json.Unmarshal(r.body, &o) != nil {
		return
	}
	msg, _ := o.str("error")
	accepted, isIntent := o.boolean("accepted")
	status, _ := o.str("status")
	if strings.HasPrefix(msg, "policy denied") && (isIntent && !accepted || status == "failed") {
		t.skipf("needs tool %s allowed, and the server's policy denies it (%s): run against a gateway whose policy allows the tools the suite makes up, as Gatehouse's built-in default does", tool, msg)
	}
}

// wantStr returns a string field or fails the check.
func (t *tc) wantStr(o obj, k, what string) string {
	s, ok := o.str(k)
	if !ok {
		t.fatalf("%s: %q is %s, want a string", what, k, show(o[k]))
	}
	return s
}

// wantEq fails unless got equals want.
func (t *tc) wantEq(what string, got, want any) {
	if !reflect.DeepEqual(got, want) {
		t.fatalf("%s = %v, want %v", what, got, want)
	}
}

// wantJSON fails unless the raw JSON value equals want (any Go value or raw
// JSON) as decoded JSON: key order, spacing and escaping do not matter.
func (t *tc) wantJSON(what string, got json.RawMessage, want any) {
	if !sameJSON(got, want) {
		t.fatalf("%s = %s, want %s", what, show(got), show(want))
	}
}

// sameJSON compares two JSON values semantically; want may be raw JSON or
// any encodable Go value.
func sameJSON(got json.RawMessage, want any) bool {
	var wantRaw []byte
	switch w := want.(type) {
	case json.RawMessage:
		wantRaw = w
	case []byte:
		wantRaw = w
	default:
		var err error
		if wantRaw, err = json.Marshal(w); err != nil {
			return false
		}
	}
	if len(bytes.TrimSpace(got)) == 0 {
		got = json.RawMessage("null")
	}
	if len(bytes.TrimSpace(wantRaw)) == 0 {
		wantRaw = []byte("null")
	}
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal(wantRaw, &b) != nil {
		return false
	}
	return reflect.DeepEqual(a, b)
}

// show renders a value for a message.
func show(v any) string {
	switch x := v.(type) {
	case nil:
		return "absent"
	case json.RawMessage:
		if x == nil {
			return "absent"
		}
		return string(x)
	case []byte:
		return string(x)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(data)
}

// wantTime fails unless the field is an RFC 3339 timestamp.
func (t *tc) wantTime(o obj, k, what string) time.Time {
	s := t.wantStr(o, k, what)
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.fatalf("%s: %q = %q is not RFC 3339", what, k, s)
	}
	return ts
}

// newID returns prefix plus 16 random hex digits. Hex digits never spell a
// shell name, so tool ids made with it pass the default policy.
func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// uuidLike returns an id no server has issued, in UUID form.
func uuidLike() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
