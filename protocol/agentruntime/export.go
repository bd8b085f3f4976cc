package agentruntime

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// Export is an evidence or replay export of a session: its events, in
// their Agent Runtime form, the read models folded from them, and a digest
// a third party recomputes to check that the events are the ones exported.
type Export struct {
	SchemaVersion string `json:"schemaVersion"`
	Kind          string `json:"kind"`
	SessionID     string `json:"sessionId"`
	ExportedAt    string `json:"exportedAt"`
	// Events are the session's retained events, in sequence order.
	Events []json.RawMessage `json:"events"`
	// Snapshot is the fold of Events: folding them again gives it again.
	Snapshot json.RawMessage `json:"snapshot"`
	Digest   Digest          `json:"digest"`
}

// Digest is SHA-256 over each event's bytes, as exported, followed by a
// newline.
type Digest struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"value"`
	Events    int    `json:"events"`
}

// maxExportEvents bounds an export; a longer session is exported from its
// last retained events, and the export says where it starts.
const maxExportEvents = 100000

// DefaultExports is how many exports a surface writes at once when
// Options.Exports is zero; more are refused with 429 until one ends.
const DefaultExports = 2

// errExportsBusy refuses an export while the surface writes its most.
var errExportsBusy = errors.New("too many exports at once; retry shortly")

// export answers GET /exports/{sessionId}.
func (s *Surface) export(r *protocol.Request) error {
	x, err := s.exportFor(r, r.Params[0], "evidence")
	if err != nil {
		return err
	}
	x.send(r.Ctx)
	return nil
}

// exportFor checks that r's principal may read session id and takes an
// export slot; the export is written by its send.
func (s *Surface) exportFor(r *protocol.Request, id, kind string) (*exportWriter, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActRead, id); err != nil {
		return nil, err
	}
	select {
	case s.exports <- struct{}{}:
	default:
		return nil, errExportsBusy
	}
	return &exportWriter{s: s, id: id, kind: kind}, nil
}

// exportWriter streams one export as its response body: the events leave
// as they are read, a page of the session's log at a time, so an export
// costs the memory of one page and the read model, whatever the size of
// the session.
type exportWriter struct {
	s        *Surface
	id, kind string
}

// send answers with the export, streamed. A failure once the body has
// begun leaves the JSON unterminated, which no client takes for an export
// (and the digest of a cut export cannot match).
func (x *exportWriter) send(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer func() { <-x.s.exports }()
		_ = x.s.writeExport(context.Background(), w, x.id, x.kind)
	})
}

// writeExport writes the export of session id to w: the JSON encoding of
// an Export, byte for byte, without holding its events.
func (s *Surface) writeExport(ctx context.Context, w io.Writer, id, kind string) error {
	head, err := json.Marshal(&Export{SchemaVersion: SchemaVersion, Kind: kind, SessionID: id, ExportedAt: timestamp(time.Now())})
	if err != nil {
		return err
	}
	// The head ends with the empty events list and what follows it: cut
	// there, the events are written in, then the rest.
	cut := bytes.Index(head, []byte(`"events":null`))
	if _, err := w.Write(head[:cut]); err != nil {
		return err
	}
	if _, err := io.WriteString(w, `"events":[`); err != nil {
		return err
	}
	m := newModel(id)
	h := sha256.New()
	n := 0
	err = s.o.Sessions.WalkResolved(ctx, s.o.Kernel, id, 0, func(items []session.Resolved) (bool, error) {
		for i := range items {
			f := factOf(id, &items[i])
			e, ok := render(&f)
			if !ok {
				continue
			}
			data, err := json.Marshal(&e)
			if err != nil {
				return false, err
			}
			if err := m.fold(data); err != nil {
				return false, err
			}
			h.Write(data)
			h.Write([]byte{'\n'})
			if n > 0 {
				if _, err := io.WriteString(w, ","); err != nil {
					return false, err
				}
			}
			if _, err := w.Write(data); err != nil {
				return false, err
			}
			if n++; n == maxExportEvents {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	snap := m.snapshot()
	data, err := json.Marshal(&snap)
	if err != nil {
		return err
	}
	tail, err := json.Marshal(struct {
		Snapshot json.RawMessage `json:"snapshot"`
		Digest   Digest          `json:"digest"`
	}{data, Digest{Algorithm: "sha256", Value: hex.EncodeToString(h.Sum(nil)), Events: n}})
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, "],"); err != nil {
		return err
	}
	_, err = w.Write(tail[1:])
	return err
}

// Verify checks an export: its digest matches its events, and folding the
// events gives its snapshot. It is what a third party does with one.
func Verify(x *Export) error {
	h := sha256.New()
	m := newModel(x.SessionID)
	for _, e := range x.Events {
		h.Write(e)
		h.Write([]byte{'\n'})
		if err := m.fold(e); err != nil {
			return err
		}
	}
	if hex.EncodeToString(h.Sum(nil)) != x.Digest.Value || len(x.Events) != x.Digest.Events {
		return errors.New("agentruntime: the events do not match the export's digest")
	}
	snap := m.snapshot()
	data, err := json.Marshal(&snap)
	if err != nil {
		return err
	}
	if string(data) != string(x.Snapshot) {
		return errors.New("agentruntime: folding the exported events does not give the exported snapshot")
	}
	return nil
}
