package runtimeapi

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/stream"
)

// frame is one event of a Runtime API stream: its id (the kernel event it
// renders and its place among that event's frames), name and data.
type frame struct {
	id   string
	name string
	data []byte
}

// position is where a stream resumes: after frame sub of kernel event seq
// (sub -1: after all of its frames).
type position struct {
	seq uint64
	sub int
}

// parsePosition reads a Last-Event-ID, "<seq>.<sub>" or "<seq>"; anything
// else is the start.
func parsePosition(id string) (position, bool) {
	if id == "" {
		return position{sub: -1}, true
	}
	seqText, subText, dotted := strings.Cut(id, ".")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return position{}, false
	}
	if !dotted {
		return position{seq: seq, sub: -1}, true
	}
	sub, err := strconv.Atoi(subText)
	if err != nil || sub < 0 || sub > 16 {
		return position{}, false
	}
	return position{seq: seq, sub: sub}, true
}

// execSource reads a direct execution's log and gives the Runtime API's
// events for it, ending after the terminal one.
type execSource struct {
	k       Kernel
	v       kernel.View // the execution when the stream opened
	watch   *kernel.Watch
	from    position
	ended   bool
	pending []frame
	out     []frame
}

func (s *Surface) source(v kernel.View, from position) *execSource {
	return &execSource{k: s.o.Kernel, v: v, watch: s.o.Kernel.Watch(v.ID), from: from}
}

func (src *execSource) Next(buf []stream.Item) (int, error) {
	// Events the API shows nothing of give no frame: read on until one
	// does or the log has nothing more, since an empty batch tells the
	// stream to wait for the log to grow.
	for len(src.pending) == 0 && !src.ended {
		n, err := src.read(len(buf))
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
	}
	src.out = append(src.out[:0], src.pending[:min(len(buf), len(src.pending))]...)
	src.pending = src.pending[len(src.out):]
	for i := range src.out {
		buf[i] = stream.Item{Type: src.out[i].name, Value: &src.out[i]}
	}
	if src.ended && len(src.pending) == 0 {
		return len(src.out), stream.ErrEnd
	}
	return len(src.out), nil
}

// readBytes bounds the frame bytes one read renders, so a batch of large
// results stays small.
const readBytes = 1 << 20

// read renders up to limit kernel events after the stream's position,
// fewer once their frames hold readBytes, and reports how many it read. A
// position past the terminal event (a client that saw everything) ends the
// stream at once.
func (src *execSource) read(limit int) (int, error) {
	after := src.from.seq
	if src.from.sub >= 0 && after > 0 {
		after-- // the event is read again, its first frames skipped
	}
	n, size := 0, 0
	err := src.k.ReadEventValues(src.v.ID, after, func(e *event.Event) bool {
		frames := src.render(e)
		skip := 0
		if e.Sequence == src.from.seq && src.from.sub >= 0 {
			skip = src.from.sub + 1
		}
		for i := skip; i < len(frames); i++ {
			frames[i].id = strconv.FormatUint(e.Sequence, 10) + "." + strconv.Itoa(i)
			src.pending = append(src.pending, frames[i])
			size += len(frames[i].data)
		}
		src.from = position{seq: e.Sequence, sub: -1}
		n++
		if terminal(e.Type) {
			src.ended = true
			return false
		}
		return n < limit && size < readBytes
	})
	if err != nil || n > 0 || !src.v.Status.Terminal() {
		return n, err
	}
	src.ended = true
	return 0, nil
}

func terminal(typ string) bool {
	return typ == event.ExecutionCompleted || typ == event.ExecutionFailed || typ == event.ExecutionCancelled
}

func (src *execSource) OnWake(f func()) { src.watch.OnWake(f) }

func (src *execSource) Close() { src.watch.Stop() }

// render maps one kernel event to the Runtime API's events: the session
// envelope first, run statuses, the tool's use and result, and one
// terminal event.
func (src *execSource) render(e *event.Event) []frame {
	id, run := src.v.ID, runID(src.v.ID)
	tool := ""
	if src.v.Tool != nil {
		tool = src.v.Tool.ToolID
	}
	status := func(st string) frame {
		return mk("run_status", map[string]any{"runId": run, "executionId": id, "status": st, "interactionMode": interactionMode})
	}
	switch e.Type {
	case event.ExecutionCreated:
		return []frame{mk("session", map[string]any{"id": src.v.SessionID, "executionId": id, "runId": run, "interactionMode": interactionMode})}
	case event.ExecutionStarted, event.ExecutionResumed:
		return []frame{status("executing")}
	case event.ExecutionBlocked:
		return []frame{status("waiting")}
	case event.StepCreated:
		var p struct {
			Arguments json.RawMessage `json:"arguments"`
		}
		_ = json.Unmarshal(e.Payload, &p)
		return []frame{mk("tool_use", map[string]any{"id": e.StepID, "name": tool, "input": json.RawMessage(orEmpty(p.Arguments)), "executionId": id, "runId": run})}
	case event.StepRetried:
		return []frame{mk("checkpoint", map[string]any{"summary": "retrying " + tool, "executionId": id, "runId": run})}
	case event.StepCompleted, event.StepFailed, event.StepTimedOut, event.StepCancelled:
		var p struct {
			Result    json.RawMessage `json:"result"`
			Error     string          `json:"error"`
			Retryable bool            `json:"retryable"`
		}
		_ = json.Unmarshal(e.Payload, &p)
		if e.Type == event.StepCompleted {
			return []frame{mk("tool_result", map[string]any{"id": e.StepID, "name": tool, "output": json.RawMessage(orNull(p.Result)), "error": false, "executionId": id, "runId": run})}
		}
		if p.Retryable {
			return nil // its retry goes on
		}
		msg := p.Error
		if msg == "" {
			msg = strings.TrimPrefix(e.Type, "step.")
		}
		return []frame{mk("tool_result", map[string]any{"id": e.StepID, "name": tool, "output": map[string]string{"message": msg}, "error": true, "executionId": id, "runId": run})}
	case event.ExecutionCompleted:
		var p struct {
			Output json.RawMessage `json:"output"`
		}
		_ = json.Unmarshal(e.Payload, &p)
		return []frame{status("completed"), mk("done", map[string]any{"status": "completed", "summary": summarize(src.v.Tool, p.Output), "executionId": id, "runId": run})}
	case event.ExecutionFailed, event.ExecutionCancelled:
		var p struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(e.Payload, &p)
		code := "EXECUTION_FAILED"
		if e.Type == event.ExecutionCancelled {
			code, p.Error = "EXECUTION_CANCELLED", "execution cancelled"
		}
		if p.Error == "" {
			p.Error = "execution failed"
		}
		return []frame{status("failed"), mk("error", map[string]any{"message": p.Error, "code": code, "executionId": id, "runId": run})}
	}
	return nil
}

func mk(name string, data any) frame {
	b, _ := json.Marshal(data)
	return frame{name: name, data: b}
}

func orNull(v json.RawMessage) json.RawMessage {
	if len(v) == 0 {
		return json.RawMessage("null")
	}
	return v
}

// renderer writes a frame as one SSE event: its id, name and data.
var renderer = stream.RenderFunc(func(f *stream.Frame, it stream.Item) (bool, error) {
	fr := it.Value.(*frame)
	f.ID = append(f.ID, fr.id...)
	f.Event = fr.name
	f.Data = append(f.Data, fr.data...)
	return true, nil
})

// streamEvents answers GET /executions/{id}/events: the execution's events
// from the start (or after Last-Event-ID), then live, ending after the
// terminal event; opened after the end it replays everything and ends.
func (s *Surface) streamEvents(r *protocol.Request) error {
	v, err := s.execution(r.Ctx, r.Principal, r.Params[0])
	if err != nil {
		return err
	}
	from, ok := parsePosition(string(r.Ctx.Request.Header.Peek("Last-Event-ID")))
	if !ok {
		return badRequest("Last-Event-ID: want <sequence>.<n> as the stream sent it")
	}
	r.Gateway.SSE(r, "runtime", renderer, stream.SSEOptions{}, true, func(*stream.Options) (stream.Source, func()) {
		return s.source(v, from), nil
	})
	return nil
}
