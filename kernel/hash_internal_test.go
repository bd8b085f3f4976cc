package kernel

import (
	"crypto/sha256"
	"encoding/hex"
	stdjson "encoding/json"
	"testing"
)

// TestRequestHashIsEncodingJSONs: the kernel encodes with segmentio's
// encoder, and an idempotency key's stored hash was computed by earlier
// releases with encoding/json; a retry after an upgrade must hash the same,
// or it would be refused as a different request. The events' payloads are
// encoded the same way, so they keep their bytes too.
func TestRequestHashIsEncodingJSONs(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
	}{
		{"create", CreateRequest{AgentID: "a", Input: stdjson.RawMessage(`{ "q" : "<b>&</b>", "n": [1, 2.5e21, -0.0000001] }`), Labels: map[string]string{"z": "1", "a": "é\u2028"}}},
		{"create, nothing set", CreateRequest{}},
		{"invoke", IntentRequest{ExecutionID: "e", SessionID: "s", Intent: Intent{Type: "invoke_tool", ToolID: "t", Arguments: stdjson.RawMessage(` {"ms":1} `), Remote: true}}},
		{"complete", IntentRequest{ExecutionID: "e", Intent: Intent{Type: "complete", Output: stdjson.RawMessage(`"\u00e9\ud83d\ude00"`), Error: "bad \xff byte"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := stdjson.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			if got, want := requestHash(tc.v), hex.EncodeToString(sum[:16]); got != want {
				t.Fatalf("hash %s, encoding/json's %s (of %s)", got, want, data)
			}
		})
	}
}
