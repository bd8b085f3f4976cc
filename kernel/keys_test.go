package kernel

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
)

// oldSummaryKey is the list key of the earlier layout, as it was written.
func oldSummaryKey(created time.Time, id string) string {
	return fmt.Sprintf("%016x/%s", uint64(1<<63-1-created.UnixNano()), id)
}

// TestSummaryKeysOrderNewestFirst: list keys sort by creation time, newest
// first, then by id, within a millisecond's bucket and across buckets:
// exactly the order of the earlier layout's keys.
func TestSummaryKeysOrderNewestFirst(t *testing.T) {
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	type row struct {
		created time.Time
		id      string
	}
	rows := []row{
		{base, "a"},
		{base, "b"},                                 // same ns: by id
		{base.Add(1), "a"},                          // same ms, a ns later
		{base.Add(time.Millisecond - 1), "z"},       // last ns of the ms
		{base.Add(time.Millisecond), "a"},           // first ns of the next ms
		{base.Add(-1), "m"},                         // last ns of the ms before
		{base.Add(time.Hour), "0190aaaa-0000-7000"}, // far apart
		{base.Add(-time.Hour), "zz"},
		{time.Unix(0, 0).UTC(), "epoch"},
		{time.Unix(0, 999_999).UTC(), "epoch+"},
	}
	want := slices.Clone(rows)
	slices.SortFunc(want, func(a, b row) int {
		if c := b.created.Compare(a.created); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	got := slices.Clone(rows)
	slices.SortFunc(got, func(a, b row) int {
		return strings.Compare(summaryKey(a.created, a.id), summaryKey(b.created, b.id))
	})
	if !slices.Equal(got, want) {
		t.Errorf("by key:\n %v\nwant (created desc, then id):\n %v", got, want)
	}
	old := slices.Clone(rows)
	slices.SortFunc(old, func(a, b row) int {
		return strings.Compare(oldSummaryKey(a.created, a.id), oldSummaryKey(b.created, b.id))
	})
	if !slices.Equal(got, old) {
		t.Errorf("by key:\n %v\nby the earlier layout's key:\n %v", got, old)
	}
	for _, r := range rows {
		k := summaryKey(r.created, r.id)
		if !isSummaryKey(k) || !strings.HasPrefix(k, bucket(r.created.UnixMilli())+"/s/") {
			t.Errorf("summaryKey(%v, %q) = %q: not in its bucket", r.created, r.id, k)
		}
		created, id, ok := parseOldSummaryKey(oldSummaryKey(r.created, r.id))
		if !ok || !created.Equal(r.created) || id != r.id || summaryKey(created, id) != k {
			t.Errorf("earlier key of %v %q read back as %v %q %v", r.created, r.id, created, id, ok)
		}
	}
}

// TestKeysOfAnExecutionDeriveFromItsID: an execution's index and
// idempotency keys are in the bucket of its UUIDv7's millisecond, found
// from the id alone; any other id goes to the bucket of millisecond 0, the
// kind's last.
func TestKeysOfAnExecutionDeriveFromItsID(t *testing.T) {
	const ms = 0x0190aaaa1234
	for _, tc := range []struct {
		name, id string
		ms       int64
	}{
		{"UUIDv7", "0190aaaa-1234-7000-8000-000000000000", ms},
		{"UUIDv7 in capitals", "0190AAAA-1234-7ABC-8000-00000000000F", ms},
		{"UUIDv4 (NewID's fallback)", "0190aaaa-1234-4000-8000-000000000000", 0},
		{"UUIDv7 without hyphens", "0190aaaa12347000800000000000000000", 0},
		{"not a UUID", "exec-1", 0},
		{"a UUID's length, not a UUID", "0190aaaa-1234-7000-8000-00000000000g", 0},
		{"empty", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := idMillis(tc.id); got != tc.ms {
				t.Fatalf("idMillis = %#x, want %#x", got, tc.ms)
			}
			b := bucket(tc.ms)
			if got := indexKey(tc.id); got != b+"/i/"+tc.id {
				t.Errorf("indexKey = %q", got)
			}
			if got := idemKey(tc.id, "k/1"); got != b+"/k/"+tc.id+"/k/1" || !strings.HasPrefix(got, idemPrefix(tc.id)) {
				t.Errorf("idemKey = %q, prefix %q", got, idemPrefix(tc.id))
			}
			if isSummaryKey(indexKey(tc.id)) || isSummaryKey(idemKey(tc.id, "k")) {
				t.Error("an index or idempotency key passes for a list key")
			}
		})
	}
	if bucket(0) != "7fffffffffffffff" || bucket(ms) >= bucket(0) || bucket(ms+1) >= bucket(ms) {
		t.Errorf("buckets do not sort newest first: %s %s %s", bucket(ms+1), bucket(ms), bucket(0))
	}
	before := time.Now().UnixMilli()
	id := event.NewID()
	if got := idMillis(id); got < before || got > time.Now().UnixMilli() {
		t.Errorf("NewID %s: millisecond %d, made between %d and now", id, got, before)
	}
}
