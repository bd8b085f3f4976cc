package kernel

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// kindExec holds every record of an execution that stays once it has
// ended, so that their number grows with the executions stored: its list
// entry, the entry's index by execution id and the answers to its keyed
// requests. They share one kind, in buckets of one millisecond, newest
// first:
//
//	<bucket of created>/s/<inverted created ns>/<id>  -> Summary (the list)
//	<bucket of id>/i/<id>                             -> its list key
//	<bucket of id>/k/<id>/<idempotency key>           -> idemRecord
//
// Why one kind, newest first. Badger's memory tables, written out, become
// tables whose compactions rewrite every older key their key range spans.
// The records written all the time (outboxes, live markers, peers) lie
// before this kind, and new executions' records at its start, so a table
// spans the kind's newest buckets only, whatever the number stored. With
// two kinds that grow, one would lie whole inside that span: the earlier
// layout (a list kind newest first, an index and the idempotency records
// by id, oldest first) made every compaction of level 0 rewrite the index
// of every execution stored. So no kind the kernel or another package
// writes often may sort after "x" (none does: the kinds in use start with
// a to w), and a record that grows with the executions stored belongs here.
//
// Every write to this kind is lazy (store.Batch.PutLazy): an execution's
// list entry changes with its status in its first second, and Badger gets
// only the last of its writes, with its index entry and keyed answers, in
// one hand-over a second rather than a transaction per commit; reads find
// the waiting ones first. In the bench that is one version of each key,
// four per execution, where Badger took five (docs/decisions.md,
// "Executions' records reach Badger once").
//
// An id that is not a UUIDv7 (event.NewID falls back to a random UUIDv4
// when the system's random source fails; an id from elsewhere) has no time
// in it: its index and idempotency records go to the bucket of millisecond
// 0, the kind's last, where they stay put.
const kindExec = "x"

// bucketLen is the length of a bucket's name.
const bucketLen = 16

// bucket names the bucket of the Unix millisecond ms: its inverse, so that
// newer sorts first, in 16 hex digits.
func bucket(ms int64) string {
	return hex16(uint64(1<<63 - 1 - ms))
}

func hex16(v uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	return string(b[:])
}

// idMillis returns the Unix millisecond in the UUIDv7 id, or 0 for any
// other id.
func idMillis(id string) int64 {
	if len(id) != 36 {
		return 0
	}
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 {
		return 0
	}
	var b [8]byte
	copy(b[2:], u[:6])
	return int64(binary.BigEndian.Uint64(b[:]))
}

// summaryKey orders executions newest first, by creation time, then by id:
// the list is read in key order.
func summaryKey(created time.Time, id string) string {
	ns := created.UnixNano()
	return bucket(created.UnixMilli()) + "/s/" + hex16(uint64(1<<63-1-ns)) + "/" + id
}

// isSummaryKey reports whether key, of kindExec, is a list entry's.
func isSummaryKey(key string) bool {
	return len(key) > bucketLen+3 && key[bucketLen:bucketLen+3] == "/s/"
}

// indexKey is where the key of execution id's list entry is kept.
func indexKey(id string) string {
	return bucket(idMillis(id)) + "/i/" + id
}

// idemKey is where the answer to the request of execution id keyed key is
// kept; idemPrefix(id) starts the keys of all of them.
func idemKey(id, key string) string { return idemPrefix(id) + key }

func idemPrefix(id string) string { return bucket(idMillis(id)) + "/k/" + id + "/" }

// parseOldSummaryKey splits a list key of the earlier layout (inverted
// created ns "/" id) into the creation time and id.
func parseOldSummaryKey(key string) (created time.Time, id string, ok bool) {
	if len(key) < bucketLen+2 || key[bucketLen] != '/' {
		return time.Time{}, "", false
	}
	inv, err := strconv.ParseUint(key[:bucketLen], 16, 64)
	if err != nil {
		return time.Time{}, "", false
	}
	// Modulo 2^64, as summaryKey computes it: every key comes back whole.
	return time.Unix(0, int64(uint64(1<<63-1)-inv)).UTC(), key[bucketLen+1:], true
}
