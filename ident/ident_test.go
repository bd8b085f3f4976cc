package ident

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		id   string
		want string // "" when valid; else a part of the message
	}{
		{"a", ""},
		{"gatehouse.echo", ""},
		{"tools/bash", ""},
		{"alice@example.com", ""},
		{"0190c0de-7e57-7000-8000-000000000001", ""},
		{"my agent", ""},
		{"agent-é", ""},
		{"エージェント", ""},
		{"😀", ""},
		{strings.Repeat("x", MaxLen), ""},
		{"", "is empty"},
		{strings.Repeat("x", MaxLen+1), "exceeds maximum length of 256 characters"},
		{"a\nb", "control character U+000A at byte 1"},
		{"a\x00", "control character U+0000 at byte 1"},
		{"\tx", "control character U+0009 at byte 0"},
		{"a\x1b[31m", "control character U+001B at byte 1"},
		{"a\x7f", "control character U+007F at byte 1"},
		{"a\u0085", "control character U+0085 at byte 1"},
		{"bash\u200b", "format character U+200B at byte 4"},
		{"a\u202ehsab", "format character U+202E at byte 1"},
		{"\ufeffa", "format character U+FEFF at byte 0"},
		{"a\u2028b", "line separator U+2028 at byte 1"},
		{"a\xffb", "is not UTF-8 at byte 1"},
		{"a\xed\xa0\x80", "is not UTF-8 at byte 1"}, // an encoded surrogate
	} {
		err := Check("agent_id", c.id)
		if c.want == "" {
			if err != nil {
				t.Errorf("Check(%q) = %v; want valid", c.id, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("Check(%q) = nil; want an error with %q", c.id, c.want)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "agent_id ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%q) = %q; want ErrInvalid naming agent_id with %q", c.id, err, c.want)
		}
	}
	if err := CheckLen("channel id", strings.Repeat("x", 129), 128); err == nil || !strings.Contains(err.Error(), "128") {
		t.Errorf("129 bytes within 128: %v", err)
	}
}

// FuzzCheck holds the rule to its definition, and its errors to printable
// ASCII whatever the id held: nothing of a refused id is echoed.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"a", "a b", "a\nb", "tools/bash", strings.Repeat("x", 257), "\u202e", "\xff", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		want := len(id) >= 1 && len(id) <= MaxLen && utf8.ValidString(id)
		for _, r := range id {
			want = want && !unicode.In(r, unicode.Cc, unicode.Cf) && r != '\u2028' && r != '\u2029'
		}
		err := Check("f", id)
		if (err == nil) != want {
			t.Fatalf("Check(%q) = %v; want valid %v", id, err, want)
		}
		if err == nil {
			return
		}
		for _, c := range []byte(err.Error()) {
			if c < ' ' || c > '~' {
				t.Fatalf("the error carries a byte of the id: %q", err)
			}
		}
	})
}
