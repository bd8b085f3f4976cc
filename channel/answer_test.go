package channel

import (
	"crypto/rand"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/bridge"
)

// testKeys is a signing key of its own for each run, so that what an
// earlier run signed (and its fuzz cache kept) is a forgery now.
func testKeys() *keys {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return &keys{key: k}
}

const fuzzAction = "01a21b72-fb30-70ba-8e09-9f43c38b44a3"

// FuzzButtonValue: of all the bytes an attacker may send as a button's
// data, only the values the gateway signed for that destination open, to
// what was signed; nothing panics.
func FuzzButtonValue(f *testing.F) {
	k := testKeys()
	signed := map[string][2]string{}
	for _, d := range []string{bridge.DecisionAllowOnce, bridge.DecisionAllowAlways, bridge.DecisionDeny} {
		v := k.value("slack", "C1", fuzzAction, d)
		signed[v] = [2]string{fuzzAction, d}
		f.Add(v)
		f.Add(strings.ToUpper(v))
		f.Add(v[:len(v)-1])
	}
	f.Add("o..")
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		action, decision, ok := k.open("slack", "C1", v)
		want, isSigned := signed[v]
		if ok != isSigned || (ok && (action != want[0] || decision != want[1])) {
			t.Fatalf("%q opened to %q %q %v", v, action, decision, ok)
		}
		if _, _, ok := k.open("slack", "C2", v); ok {
			t.Fatalf("%q opened for another destination", v)
		}
	})
}

// FuzzAnswerToken: only a token the gateway signed opens, to its claims;
// nothing panics.
func FuzzAnswerToken(f *testing.F) {
	k := testKeys()
	tok := k.token(tokenClaims{Action: fuzzAction, Owner: "alice", Adapter: "webpush", Dest: "d1", Expires: 1 << 40})
	f.Add(tok)
	f.Add(tok[:len(tok)-1])
	f.Add(strings.Replace(tok, ".", "..", 1))
	f.Add(".")
	f.Fuzz(func(t *testing.T, s string) {
		c, ok := k.openToken(s)
		if ok != (s == tok) || (ok && (c.Action != fuzzAction || c.Owner != "alice" || c.Dest != "d1")) {
			t.Fatalf("%q opened: %+v %v", s, c, ok)
		}
	})
}
