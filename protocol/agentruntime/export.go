package agentruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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

// export answers GET /exports/{sessionId}.
func (s *Surface) export(r *protocol.Request) error {
	out, err := s.exportFor(r, r.Params[0], "evidence")
	if err != nil {
		return err
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

func (s *Surface) exportFor(r *protocol.Request, id, kind string) (*Export, error) {
	if _, err := s.session(r.Ctx, r.Principal, auth.ActRead, id); err != nil {
		return nil, err
	}
	return s.exportSession(r.Ctx, id, kind)
}

// exportSession builds the export of session id.
func (s *Surface) exportSession(ctx context.Context, id, kind string) (*Export, error) {
	x := &Export{SchemaVersion: SchemaVersion, Kind: kind, SessionID: id, ExportedAt: timestamp(time.Now()), Events: []json.RawMessage{}}
	m := newModel(id)
	h := sha256.New()
	err := s.o.Sessions.WalkResolved(ctx, s.o.Kernel, id, 0, func(items []session.Resolved) (bool, error) {
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
			x.Events = append(x.Events, data)
		}
		return len(x.Events) < maxExportEvents, nil
	})
	if err != nil {
		return nil, err
	}
	snap := m.snapshot()
	data, err := json.Marshal(&snap)
	if err != nil {
		return nil, err
	}
	x.Snapshot = data
	x.Digest = Digest{Algorithm: "sha256", Value: hex.EncodeToString(h.Sum(nil)), Events: len(x.Events)}
	return x, nil
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
