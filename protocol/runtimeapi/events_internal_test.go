package runtimeapi

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParsePosition: a Last-Event-ID of the Runtime API's stream is
// "<seq>" or "<seq>.<sub>" with sub 0-16, as the stream writes its ids;
// everything else is refused, and what is taken prints back the same.
func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"", "7", "7.0", "7.16", "7.17", "x.y", "5.", ".5", "-1", "7.-1", "18446744073709551616", "1.2.3", "007.01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		p, ok := parsePosition(id)
		if !ok || id == "" {
			return
		}
		seq, sub, dotted := strings.Cut(id, ".")
		n, err := strconv.ParseUint(seq, 10, 64)
		if err != nil || n != p.seq {
			t.Fatalf("%q read as seq %d", id, p.seq)
		}
		if !dotted {
			if p.sub != -1 {
				t.Fatalf("%q read with sub %d", id, p.sub)
			}
			return
		}
		m, err := strconv.Atoi(sub)
		if err != nil || m != p.sub || m < 0 || m > 16 {
			t.Fatalf("%q read as sub %d", id, p.sub)
		}
	})
}
