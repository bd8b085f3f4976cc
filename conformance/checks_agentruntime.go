package conformance

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The Agent Runtime standard's own schemas (limecloud/agentruntime v0.3.9,
// commit 65ae1ec, Apache 2.0; LICENSE beside them), kept here unchanged so
// the suite judges a gateway by the standard, not by the gateway's copy.
//
//go:embed agentruntime-schema/*.json
var agentRuntimeSchemas embed.FS

// arSession makes a session whose one turn ran to completion, and returns
// its id.
func (t *tc) arSession() string {
	if t.routeMissing(http.MethodGet, "/agent-runtime/sessions") {
		t.skipf("the gateway serves no /agent-runtime surface")
	}
	a := t.newAgent()
	snap := t.expectJSON(t.call(http.MethodPost, "/agent-runtime/sessions", map[string]any{"agentId": a.id, "title": "conformance"}), http.StatusCreated)
	id := t.wantStr(snap, "sessionId", "the created session's snapshot")
	t.expectJSON(t.call(http.MethodPost, "/agent-runtime/commands/submit_turn", map[string]any{"session_id": id, "turn_id": "t1", "input": map[string]any{"q": 1}}), http.StatusOK)
	_, assigned := a.s.nextEvent(t, "execution.assigned", nil)
	r := &run{a: a, id: t.wantStr(assigned, "execution_id", "execution.assigned"), session: t.wantStr(assigned, "session_id", "execution.assigned")}
	r.accepted(map[string]any{"type": "output", "output": map[string]any{"kind": "text", "text": "done"}})
	r.complete(map[string]any{"ok": true})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		th := t.expectJSON(t.call(http.MethodGet, "/agent-runtime/sessions/"+id+"/threads/main", nil), http.StatusOK)
		if st, _ := th.str("status"); st == "idle" && th.has("lastOutcome") {
			return id
		}
		if time.Now().After(deadline) {
			t.fatalf("the turn did not end within 10s: %v", th)
		}
	}
}

func (t *tc) arValidators() (event, snapshot *jsonschema.Schema) {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	ids := map[string]string{
		"agentruntime-schema/agentruntime-event.schema.json":    "https://agentruntime.example/schemas/agentruntime-event.schema.json",
		"agentruntime-schema/agentruntime-snapshot.schema.json": "https://agentruntime.example/schemas/agentruntime-snapshot.schema.json",
	}
	for file, id := range ids {
		data, err := agentRuntimeSchemas.ReadFile(file)
		if err != nil {
			t.fatalf("schema %s: %v", file, err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err == nil {
			err = c.AddResource(id, doc)
		}
		if err != nil {
			t.fatalf("schema %s: %v", file, err)
		}
	}
	return c.MustCompile(ids["agentruntime-schema/agentruntime-event.schema.json"]), c.MustCompile(ids["agentruntime-schema/agentruntime-snapshot.schema.json"])
}

func (t *tc) arValid(s *jsonschema.Schema, what string, data []byte) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err == nil {
		err = s.Validate(inst)
	}
	if err != nil {
		t.fatalf("%s does not validate against the standard's schema: %v: %s", what, err, data)
	}
}

// arEvents reads a session's events page.
func (t *tc) arEvents(id, query string) []json.RawMessage {
	var page struct {
		Events []json.RawMessage `json:"events"`
	}
	r := t.call(http.MethodGet, "/agent-runtime/sessions/"+id+"/events"+query, nil)
	t.expect(r, http.StatusOK)
	if err := json.Unmarshal(r.body, &page); err != nil {
		t.fatalf("events page: %v: %s", err, r)
	}
	return page.Events
}

func checkAgentRuntimeSchemas(t *tc) {
	id := t.arSession()
	eventSchema, snapshotSchema := t.arValidators()
	var last uint64
	evs := t.arEvents(id, "?limit=1000")
	if len(evs) < 8 {
		t.fatalf("a session with one finished turn has %d events", len(evs))
	}
	for i, e := range evs {
		t.arValid(eventSchema, "event "+strconv.Itoa(i), e)
		var env struct{ Sequence uint64 }
		_ = json.Unmarshal(e, &env)
		if env.Sequence <= last {
			t.fatalf("event %d has sequence %d after %d", i, env.Sequence, last)
		}
		last = env.Sequence
	}
	r := t.call(http.MethodGet, "/agent-runtime/sessions/"+id, nil)
	t.expect(r, http.StatusOK)
	t.arValid(snapshotSchema, "the snapshot", r.body)
}

func checkAgentRuntimeResume(t *tc) {
	id := t.arSession()
	all := t.arEvents(id, "?limit=1000")
	s := t.mustStream("/agent-runtime/sessions/"+id+"/events", header("Accept", "text/event-stream"), header("Last-Event-ID", "3"))
	defer s.close()
	f := s.next(t, "the first event after Last-Event-ID 3", func(f frame) bool { return f.isEvent() })
	if f.id != "4" || string(f.data) != string(all[3]) {
		t.fatalf("resumed after 3 with id %q: %s, want id 4: %s", f.id, f.data, all[3])
	}
}

func checkAgentRuntimeCommands(t *tc) {
	id := t.arSession()
	again := t.expectJSON(t.call(http.MethodPost, "/agent-runtime/commands/submit_turn", map[string]any{"session_id": id, "turn_id": "t1", "input": map[string]any{"q": 1}}), http.StatusOK)
	if turn, _ := again.str("turnId"); turn != "t1" {
		t.fatalf("a retried submit_turn answered %v", again)
	}
	r := t.call(http.MethodPost, "/agent-runtime/commands/spawn_subagent", map[string]any{})
	o := t.expectError(r, http.StatusNotImplemented, "NOT_IMPLEMENTED")
	if msg, _ := o.str("error"); !bytes.Contains([]byte(msg), []byte("spawn_subagent")) {
		t.fatalf("the 501 does not name the command: %s", r)
	}
	t.expectError(t.call(http.MethodPost, "/agent-runtime/commands/not_a_command", map[string]any{}), http.StatusNotFound, "UNKNOWN_COMMAND")
}

func checkAgentRuntimeExport(t *tc) {
	id := t.arSession()
	var x struct {
		Events []json.RawMessage `json:"events"`
		Digest struct {
			Algorithm string `json:"algorithm"`
			Value     string `json:"value"`
		} `json:"digest"`
	}
	r := t.call(http.MethodGet, "/agent-runtime/exports/"+id, nil)
	t.expect(r, http.StatusOK)
	if err := json.Unmarshal(r.body, &x); err != nil {
		t.fatalf("export: %v", err)
	}
	h := sha256.New()
	for _, e := range x.Events {
		h.Write(e)
		h.Write([]byte{'\n'})
	}
	if x.Digest.Algorithm != "sha256" || hex.EncodeToString(h.Sum(nil)) != x.Digest.Value {
		t.fatalf("the digest %s %s does not match the %d exported events", x.Digest.Algorithm, x.Digest.Value, len(x.Events))
	}
}
