// Package storetest opens real stores for tests: Badger and the journal in
// a folder of the test's, closed when the test ends. Nothing is mocked.
package storetest

import (
	"testing"

	"github.com/gatehouse-dev/gatehouse/store"
)

// Open opens a store with o, in a fresh temporary folder unless o.Dir or
// o.InMemory is set, and closes it when the test ends (a test may close
// it before: Close is idempotent).
func Open(tb testing.TB, o store.Options) *store.Store {
	tb.Helper()
	if o.Dir == "" && !o.InMemory {
		o.Dir = tb.TempDir()
	}
	st, err := store.Open(o)
	if err != nil {
		tb.Fatalf("storetest: open: %v", err)
	}
	tb.Cleanup(func() {
		if err := st.Close(); err != nil {
			tb.Errorf("storetest: close: %v", err)
		}
	})
	return st
}

// Reopen closes st and opens its folder again with o, as a restart does:
// what st made durable must be there.
func Reopen(tb testing.TB, st *store.Store, o store.Options) *store.Store {
	tb.Helper()
	if err := st.Close(); err != nil {
		tb.Fatalf("storetest: close before reopening: %v", err)
	}
	return Open(tb, o)
}
