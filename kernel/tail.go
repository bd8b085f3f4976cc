package kernel

// An execution's tail is its latest events in the stored form, kept in
// memory from its first commit in this process until it ends and nobody
// watches it. A stream that follows a live execution reads them there:
// what a commit just made durable is in the store's journal but may not
// be in Badger yet, and reading Badger would wait for it to be applied
// and open an iterator per wake-up. The store stays the truth; the tail
// only ever holds a contiguous run of committed events, and a reader
// whose cursor is before that run reads the store.
type tail struct {
	entries []tailEntry
	bytes   int
	ended   bool
}

type tailEntry struct {
	seq uint64
	raw []byte // the stored form; never changed once committed
}

// Bounds of the tails: an execution keeps its newest events up to
// tailMaxBytes (a long-running one drops its oldest), and all tails
// together at most tailsMaxBytes (past it, a tail that would grow is
// emptied and its readers go to the store).
const (
	tailMaxBytes  = 64 << 10
	tailsMaxBytes = 32 << 20
)

// keepTail appends the events a commit made durable to id's tail. The
// commit calls it before anything that refers to those events can be read
// (the sessions' log items name an execution's sequences), and the
// execution's lock orders the commits of one execution.
func (k *Kernel) keepTail(id string, entries []tailEntry) {
	if len(entries) == 0 {
		return
	}
	k.tailMu.Lock()
	defer k.tailMu.Unlock()
	tl := k.tails[id]
	if tl == nil {
		// Room for the events of a short execution's few commits, which
		// growing one at a time took an allocation each for.
		tl = &tail{entries: make([]tailEntry, 0, max(tailRoom, len(entries)))}
		k.tails[id] = tl
	}
	for _, e := range entries {
		if n := len(tl.entries); n > 0 && tl.entries[n-1].seq+1 != e.seq {
			k.dropTail(tl) // not contiguous: start again from here
		}
		if k.tailBytes+len(e.raw) > tailsMaxBytes {
			k.dropTail(tl)
			continue
		}
		tl.entries = append(tl.entries, e)
		tl.bytes += len(e.raw)
		k.tailBytes += len(e.raw)
		drop := 0
		for tl.bytes > tailMaxBytes && drop < len(tl.entries)-1 {
			tl.bytes -= len(tl.entries[drop].raw)
			k.tailBytes -= len(tl.entries[drop].raw)
			drop++
		}
		if drop > 0 {
			tl.entries = append(tl.entries[:0], tl.entries[drop:]...)
		}
	}
}

// notify wakes id's watchers once its new events are in the tail. ended
// says the execution is over: its tail goes when nobody watches it.
func (k *Kernel) notify(id string, ended bool) {
	k.tailMu.Lock()
	if tl := k.tails[id]; tl != nil {
		tl.ended = ended
		if ended && !k.watches.Watched(id) {
			k.forgetTail(id)
		}
	}
	k.tailMu.Unlock()
	k.watches.Notify(id)
}

// unwatched runs when the last watch of execution id stopped: an ended
// execution's tail goes (unless a watch came back meanwhile).
func (k *Kernel) unwatched(id string) {
	k.tailMu.Lock()
	defer k.tailMu.Unlock()
	if tl := k.tails[id]; tl != nil && tl.ended && !k.watches.Watched(id) {
		k.forgetTail(id)
	}
}

// dropTail empties tl; the caller holds k.tailMu.
func (k *Kernel) dropTail(tl *tail) {
	k.tailBytes -= tl.bytes
	tl.entries, tl.bytes = nil, 0
}

// forgetTail removes id's tail; the caller holds k.tailMu.
func (k *Kernel) forgetTail(id string) {
	if tl := k.tails[id]; tl != nil {
		k.dropTail(tl)
		delete(k.tails, id)
	}
}

// tailFrom appends id's events after sequence after, in the stored form,
// to dst and returns it, when its tail holds the next one; false sends the
// reader to the store. The entries' bytes are never changed once
// committed, so the caller reads them without the lock; the slice holding
// them is a copy.
func (k *Kernel) tailFrom(dst []tailEntry, id string, after uint64) ([]tailEntry, bool) {
	k.tailMu.Lock()
	defer k.tailMu.Unlock()
	tl := k.tails[id]
	// Sequences start at 1, so first-1 never wraps; after+1 would, for a
	// cursor of 2^64-1.
	if tl == nil || len(tl.entries) == 0 || after < tl.entries[0].seq-1 {
		return nil, false
	}
	i := uint64(len(tl.entries))
	if skip := after - (tl.entries[0].seq - 1); skip < i {
		i = skip
	}
	return append(dst, tl.entries[i:]...), true
}

// tailRoom is how many entries a short execution's few commits add to its
// tail: the room a tail is made with, and what a reader that follows an
// execution takes from it without allocating.
const tailRoom = 8
