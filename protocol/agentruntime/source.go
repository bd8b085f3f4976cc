package agentruntime

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/gatehouse-dev/gatehouse/session"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// logSource reads a session's log from a cursor as facts, each with the
// execution event it refers to, for the stream engine.
type logSource struct {
	s     *Surface
	id    string
	last  uint64
	watch *session.Watch
	facts []fact
}

func (s *Surface) source(id string, after uint64) *logSource {
	return &logSource{s: s, id: id, last: after, watch: s.o.Sessions.Watch(id)}
}

// Next gives the next facts. A cursor older than the retained log gets a
// snapshot.updated notice first and continues from the oldest retained
// fact: the reader learns that history is gone, never skips it unaware.
func (src *logSource) Next(buf []stream.Item) (int, error) {
	facts, err := src.s.read(context.Background(), src.id, src.last, len(buf), src.facts[:0])
	if errors.Is(err, session.ErrCursorExpired) {
		first, ferr := src.s.o.Sessions.First(context.Background(), src.id)
		if ferr != nil {
			return 0, ferr
		}
		buf[0] = stream.Item{Type: "snapshot.updated", Value: &fact{sessionID: src.id, item: session.Item{Seq: first - 1, Type: factHistoryGone, At: time.Now()}}}
		src.last = first - 1
		return 1, nil
	}
	if err != nil {
		return 0, err
	}
	src.facts = facts
	for i := range facts {
		buf[i] = stream.Item{Seq: facts[i].item.Seq, Type: facts[i].item.Type, Value: &facts[i]}
		src.last = facts[i].item.Seq
	}
	return len(facts), nil
}

func (src *logSource) OnWake(f func()) { src.watch.OnWake(f) }

func (src *logSource) Close() { src.watch.Stop() }

// factHistoryGone is the notice, rendered as snapshot.updated, that a
// reader's cursor is older than the retained log.
const factHistoryGone = "gatehouse.history_gone"

// read returns up to limit facts of session id after sequence after, each
// reference resolved to its execution event, appended to into.
func (s *Surface) read(ctx context.Context, id string, after uint64, limit int, into []fact) ([]fact, error) {
	items, err := s.o.Sessions.ReadResolved(ctx, s.o.Kernel, id, after, limit, nil)
	for i := range items {
		into = append(into, factOf(id, &items[i]))
	}
	return into, err
}

func factOf(sessionID string, r *session.Resolved) fact {
	return fact{sessionID: sessionID, item: r.Item, event: r.Event}
}

// renderer shows facts as SSE frames: the event as data, named by its
// type, resumable at its sequence.
var renderer = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	fa := it.Value.(*fact)
	e, ok := renderNotice(fa)
	if !ok {
		return false, nil
	}
	data, err := json.Marshal(&e)
	if err != nil {
		return false, err
	}
	if it.Seq > 0 {
		f.ID = strconv.AppendUint(f.ID, it.Seq, 10)
	}
	f.Event = e.Type
	f.Data = append(f.Data, data...)
	return true, nil
})

// renderNotice renders a fact, or the history-gone notice.
func renderNotice(f *fact) (Event, bool) {
	if f.item.Type == factHistoryGone && f.item.Kind == session.KindFact {
		return Event{
			Type: "snapshot.updated", EventID: f.sessionID + ":gone:" + strconv.FormatUint(f.item.Seq, 10),
			Timestamp: timestamp(f.item.At), SchemaVersion: SchemaVersion, Sequence: f.item.Seq, SessionID: f.sessionID,
			Status: "stale", StatusReason: "history_gone",
			Refs: map[string]string{"snapshot": "/agent-runtime/sessions/" + f.sessionID},
		}, true
	}
	return render(f)
}
