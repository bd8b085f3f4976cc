package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gatehouse-dev/gatehouse/kernel"
)

// FuzzDecodeBody feeds the decoders of the main routes what a client may
// send, as the server does: the JSON text check first, then the body into
// each request type. A body is refused with a 400 or a 413, never a 500 or
// a panic, and what is taken re-encodes. The decoder of the usual case is
// not encoding/json's: what decodeBody takes or refuses must be what
// encoding/json's Decoder takes or refuses, with the same result.
func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{
		`{"agent_id":"a","input":{"q":"x"},"labels":{"k":"v"},"session_id":"s"}`,
		`{"execution_id":"e","session_id":"s","intent":{"type":"invoke_tool","tool_id":"t","arguments":{"ms":1},"remote":true}}`,
		`{"execution_id":"e","session_id":"s","step_id":"x","success":true,"data":[1,2]}`,
		`{"job_id":"j","execution_id":"e","step_id":"s","success":false,"error":"boom","retryable":true,"started_at":"2025-06-01T12:00:00Z"}`,
		`{"signal_type":"step.approve","payload":{"step_id":"x","approved":true}}`,
		`{"decision":"allow_once","reason":"ok","channel_id":"web","native_peer_id":"p"}`,
		`{"role":"agent","id":"a","consumer_id":"c","sequence":3}`,
		`{"tools":["t","u@acct"],"tool_info":[{"name":"t","input_schema":{}}]}`,
		`{"agent_id":1e999999}`, "{\"agent_id\":\"\xff\"}", `{"input":"\ud800"}`, `{"sequence":-1}`,
		`{"started_at":"not a time"}`, `[]`, `null`, ``, `{} {}`, `{"agent_id":"a"`,
		`{"agent_id":"a","input":{"q":1}} trailing`, `{"agent_id":"a","input":{"q":1},"labels":5}`,
		`{"AGENT_ID":"a","Input":{"<b>":"&"}}`, `{"agent_id":"a","agent_id":"b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		textErr := checkJSONText(data)
		for _, v := range []any{
			&kernel.CreateRequest{}, &kernel.IntentRequest{}, &kernel.StepResultRequest{},
			&kernel.RunnerResultRequest{}, &kernel.StepStartedRequest{}, &kernel.SignalRequest{},
			&RespondRequest{}, &ackRequest{}, &capabilitiesRequest{},
		} {
			err := decodeBody(data, v, 1<<10)
			if err != nil {
				if status, _ := statusOf(err); status != 400 && status != 413 {
					t.Fatalf("%T from %q: %d (%v)", v, data, status, err)
				}
				continue
			}
			if textErr != nil {
				continue // the server refused it before any decoder
			}
			got, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%T from %q does not re-encode: %v", v, data, err)
			}
			w := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			if err := json.NewDecoder(bytes.NewReader(data)).Decode(w); err != nil {
				t.Fatalf("%T from %q: taken, but encoding/json refuses it: %v", v, data, err)
			}
			if want, _ := json.Marshal(w); !bytes.Equal(got, want) {
				t.Fatalf("%T from %q: decoded as %s, encoding/json decodes %s", v, data, got, want)
			}
		}
	})
}
