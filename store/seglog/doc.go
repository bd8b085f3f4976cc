// Package seglog is Gatehouse's log engine: many sequenced streams (an
// execution's events, a session's log, a peer's outbox) appended to shared,
// append-only segment files, read back by stream and sequence through an
// index, and retained by dropping whole segments.
//
// # Writes
//
// A Batch holds appends (stream, sequence, bytes) and drops (every entry
// of a stream below a sequence). Concurrent Commits are grouped: the first
// committer to find no write in flight leads, writes the group waiting
// behind it as one record at the end of the segment being written, syncs it
// under SyncAlways, publishes it to the index and hands the lead to the
// next waiter, so that one write and one fdatasync serve every batch of the
// group and an uncontended commit costs no goroutine hop. Records are dense
// (no padding) and go through the page cache, so a reader of what was just
// written reads memory.
//
// Every batch has a version: the caller's (the store passes the version of
// its journal record) or the next one. A drop hides the entries of its
// stream below its sequence with an older version, and only those: a
// stream whose history was dropped may begin again at sequence 1.
//
// # Durability
//
// Under SyncAlways a Commit returns once its record is on disk. Under
// SyncNone nothing is synced but at Sync, at Close and when the log moves
// to its next segment, so that what a power cut leaves is always a prefix
// of the history: the store runs the log so, behind its own journal, which
// holds every record until Sync says the log holds it (see Durable).
//
// A segment is read at Open up to its first record that is not whole (its
// length, or the checksum that covers its bytes and the segment's number,
// does not match); nothing after it was acknowledged. A segment cut short
// so is closed at that point and the log goes on in a new one.
//
// # The index
//
// The segment being written is indexed in memory: per stream, its entries
// in sequence order. When the log moves on, the finished segment gets a
// sidecar index file (see sidecar.go): its streams, sorted by a hash of
// their names, each with its range of sequences and its entries' places,
// and its drops. Of a sealed segment, memory holds only a Bloom filter of
// its streams, one key per block of its stream table, and its drops; a
// read finds a stream's entries with one read of a block of that table and
// one of its entries. A start loads the sidecars and reads the segments
// that have none (the one being written, and one whose sidecar a crash cut
// short), so it costs the size of one segment, not of the history.
//
// # Retention
//
// Segments are dropped whole, oldest first. Compact looks at the oldest
// sealed segment: when few enough of its bytes are still live (not hidden
// by a drop), it appends those entries again, each with its original
// version, syncs them, and deletes the segment and its sidecar. Since the
// oldest segment goes first, its drops can hide nothing left anywhere else
// and go with it.
package seglog
