package event

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestAppendTimestampMatchesRFC3339Nano: the timestamp written for an event
// is byte for byte what time.RFC3339Nano gives, in UTC and in other zones,
// on the edges of days, months, years, leap days and centuries, for every
// length of the fraction, and over a sweep of random instants of years 0
// to 9999 and beyond.
func TestAppendTimestampMatchesRFC3339Nano(t *testing.T) {
	cases := []time.Time{
		time.Unix(0, 0).UTC(),
		time.Unix(-1, 0).UTC(),
		time.Unix(-1, 999999999).UTC(),
		time.Unix(1700000000, 5).UTC(),
		time.Date(2000, 2, 29, 23, 59, 59, 100000000, time.UTC),
		time.Date(2100, 2, 28, 0, 0, 0, 120000000, time.UTC),
		time.Date(1900, 3, 1, 12, 0, 0, 123000000, time.UTC),
		time.Date(1600, 12, 31, 23, 59, 59, 123400000, time.UTC),
		time.Date(2026, 11, 27, 19, 34, 18, 123450000, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 123456000, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 123456700, time.UTC),
		time.Date(0, 3, 1, 0, 0, 0, 123456780, time.UTC),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("X", 3600)),
		time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("Y", -5*3600-1800)),
		time.Date(2026, 1, 2, 3, 4, 5, 6, time.Local),
	}
	for _, c := range cases {
		if got, want := string(appendTimestamp([]byte("x"), c)), "x"+c.Format(time.RFC3339Nano); got != want {
			t.Errorf("%v: %s, want %s", c, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	const first, last = -62167219200, 253402300799 // 0000-01-01, 9999-12-31T23:59:59
	for range 200000 {
		sec := first + r.Int64N(last-first+1)
		ns := int64(0)
		switch r.IntN(3) {
		case 1:
			ns = r.Int64N(1e9)
		case 2:
			ns = r.Int64N(1000) * 1e6
		}
		c := time.Unix(sec, ns).UTC()
		if got, want := string(appendTimestamp(nil, c)), c.Format(time.RFC3339Nano); got != want {
			t.Fatalf("%d.%09d: %s, want %s", sec, ns, got, want)
		}
	}
}

// BenchmarkAppendTimestamp is a stored event's timestamp, rendered.
func BenchmarkAppendTimestamp(b *testing.B) {
	ts := time.Unix(1700000000, 123456789).UTC()
	buf := make([]byte, 0, 64)
	b.Run("event", func(b *testing.B) {
		for b.Loop() {
			buf = appendTimestamp(buf[:0], ts)
		}
	})
	b.Run("time.AppendFormat", func(b *testing.B) {
		for b.Loop() {
			buf = ts.AppendFormat(buf[:0], time.RFC3339Nano)
		}
	})
}
