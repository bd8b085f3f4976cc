package kernel

import (
	"context"
	"encoding/json"
	"math"
	"regexp"
	"testing"

	"github.com/dgraph-io/badger/v4"

	"github.com/gatehouse-dev/gatehouse/peer"
	"github.com/gatehouse-dev/gatehouse/store"
	"github.com/gatehouse-dev/gatehouse/store/storetest"
)

// TestNewExecutionsKeysSpanNoOlderExecution: the keys that the last
// executions write to Badger (their records, and whatever else changed
// meanwhile: live markers, peers, outboxes) span no key of the executions
// stored before them. A Badger table holding those writes is compacted
// with the tables whose keys its range overlaps: were an older execution's
// key inside it, every compaction would rewrite the keys of every
// execution stored, and its memory would grow with them.
func TestNewExecutionsKeysSpanNoOlderExecution(t *testing.T) {
	const older, newer = 1900, 100
	dir := t.TempDir()
	run := func(n int) []string {
		t.Helper()
		st := storetest.Open(t, store.Options{Dir: dir, Sync: store.SyncNone})
		hub, err := peer.NewHub(context.Background(), peer.Options{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		k, err := New(context.Background(), Options{Store: st, Deliverer: hubAdapter{hub}})
		if err != nil {
			t.Fatal(err)
		}
		disconnect := k.AgentConnected("ag", "c1")
		c, reset := hub.Attach(peer.Key{Role: RoleAgent, ID: "ag", Consumer: "c1"}, nil)
		if reset != nil {
			t.Fatalf("attach: %+v", reset)
		}
		box := &inbox{t: t, c: c}
		ids := make([]string, 0, n)
		for range n {
			v, _, err := k.Create(context.Background(), CreateRequest{AgentID: "ag"}, Meta{})
			if err != nil {
				t.Fatal(err)
			}
			var a assignedPush
			box.next("execution.assigned", &a)
			x := running{id: v.ID, lease: a.SessionID}
			x.intent(t, k, Intent{Type: IntentComplete, IdempotencyKey: "done", Output: json.RawMessage(`1`)})
			ids = append(ids, v.ID)
		}
		c.Detach()
		disconnect()
		k.Close()
		hub.Close()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// badgerKeys calls fn with every key Badger holds, deleted or not, and
	// the newest version written to it.
	badgerKeys := func(fn func(key []byte, version uint64)) uint64 {
		t.Helper()
		db, err := badger.OpenManaged(badger.DefaultOptions(dir).WithReadOnly(true).WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		txn := db.NewTransactionAt(math.MaxUint64, false)
		defer txn.Discard()
		it := txn.NewIterator(badger.IteratorOptions{AllVersions: true})
		defer it.Close()
		var last []byte
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if string(item.Key()) == string(last) {
				continue // an older version of the key before
			}
			last = item.KeyCopy(last[:0])
			fn(last, item.Version())
		}
		return db.MaxVersion()
	}

	first := run(older)
	written := badgerKeys(func([]byte, uint64) {})
	run(newer)
	var lo, hi string
	badgerKeys(func(key []byte, version uint64) {
		if version <= written {
			return
		}
		if lo == "" || string(key) < lo {
			lo = string(key)
		}
		if string(key) > hi {
			hi = string(key)
		}
	})
	if hi == "" {
		t.Fatal("the newer executions wrote nothing to Badger")
	}
	t.Logf("the last %d executions wrote keys from %q to %q", newer, lo, hi)
	olderIDs := make(map[string]bool, len(first))
	for _, id := range first {
		olderIDs[id] = true
	}
	uuids := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	inside, examples := 0, []string(nil)
	badgerKeys(func(key []byte, _ uint64) {
		if string(key) < lo || string(key) > hi {
			return
		}
		for _, id := range uuids.FindAll(key, -1) {
			if olderIDs[string(id)] {
				inside++
				if len(examples) < 3 {
					examples = append(examples, string(key))
				}
				return
			}
		}
	})
	if inside > 0 {
		t.Errorf("the keys written by the last %d executions span from %q to %q, and %d keys of the %d executions before them: %q",
			newer, lo, hi, inside, older, examples)
	}
}
