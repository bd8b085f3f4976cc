package gateway

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseCursor: every cursor either parses to digits that print back
// the same, names another epoch of the store's syntax, or is refused. A
// bare sequence (the execution stream's and socket's) is digits or refused.
func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"", "5", "e1.5", "x.y", "5.", ".5", "-1", "18446744073709551616", "e1.", "a.b.c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if n, err := sequence("cursor", []byte(raw)); err == nil {
			if raw != "" && (strings.Trim(raw, "0123456789") != "" || strconv.FormatUint(n, 10) != strings.TrimLeft(raw, "0") && n != 0) {
				t.Fatalf("sequence %q read as %d", raw, n)
			}
		} else if _, perr := strconv.ParseUint(raw, 10, 64); perr == nil {
			t.Fatalf("sequence %q refused: %v", raw, err)
		}
		cur, other, err := parseCursor(raw, "e1")
		switch {
		case err != nil:
			if cur != nil || other != "" {
				t.Fatalf("%q: refused with a cursor", raw)
			}
		case raw == "":
			if cur != nil || other != "" {
				t.Fatalf("empty cursor parsed")
			}
		case other != "":
			if cur != nil || !epochSyntax(other) || !strings.HasPrefix(raw, other+".") {
				t.Fatalf("%q: other epoch %q", raw, other)
			}
		default:
			seq := strings.TrimPrefix(raw, "e1.")
			n, perr := strconv.ParseUint(seq, 10, 64)
			if cur == nil || perr != nil || n != *cur || strings.Trim(seq, "0123456789") != "" {
				t.Fatalf("%q parsed to %v", raw, cur)
			}
		}
	})
}

// FuzzCheckJSONText: what the check accepts is UTF-8, and when it is JSON
// a decoder takes it whole: no number beyond float64 gets through, and no
// string comes out with a U+FFFD the text did not hold.
func FuzzCheckJSONText(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":1e999999}`, `{"s":"1e999999"}`, `[1.5e300,-2E-400]`, "\"\xff\"", `{"a":"\"1e999"}`, `99999999999999999999999999`,
		`"\ud83d\ude00"`, `"\ud800"`, `"\udc00\ud800"`, `"\\ud800"`, `"\ud800\u0041"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if checkJSONText(data) != nil {
			return
		}
		if !utf8.Valid(data) {
			t.Fatalf("accepted bytes that are not UTF-8: %q", data)
		}
		var v any
		if json.Valid(data) {
			if err := json.Unmarshal(data, &v); err != nil {
				t.Fatalf("accepted JSON that does not decode: %q: %v", data, err)
			}
			if !strings.Contains(strings.ToLower(string(data)), `\ufffd`) && !strings.ContainsRune(string(data), utf8.RuneError) && holdsFFFD(v) {
				t.Fatalf("accepted text that decodes with a U+FFFD it did not hold: %q", data)
			}
		}
	})
}

// holdsFFFD reports a U+FFFD in a decoded JSON value's strings or keys.
func holdsFFFD(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, utf8.RuneError)
	case []any:
		for _, e := range v {
			if holdsFFFD(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, utf8.RuneError) || holdsFFFD(e) {
				return true
			}
		}
	}
	return false
}
