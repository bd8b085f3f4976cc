package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

func TestOutgoingFrames(t *testing.T) {
	for _, c := range []struct {
		frame []byte
		want  string
	}{
		{appendHello(nil, "ep", "runner", "r1", "c1", 15*time.Second),
			`{"type":"hello","epoch":"ep","role":"runner","id":"r1","consumer_id":"c1","heartbeat_ms":15000}`},
		{appendHello(nil, "ep", "execution", "x", "", 100*time.Millisecond),
			`{"type":"hello","epoch":"ep","role":"execution","id":"x","heartbeat_ms":100}`},
		{appendPush(nil, frameDelivery, 7, "job.assigned", []byte(`{"id":"j"}`)),
			`{"type":"delivery","seq":7,"event":"job.assigned","data":{"id":"j"}}`},
		{appendPush(nil, frameEvent, 1, "x", nil), `{"type":"event","seq":1,"event":"x","data":null}`},
		{appendReply(nil, "a\"b", 409, []byte(`{"error":"e","code":"CONFLICT"}`)),
			`{"type":"reply","id":"a\"b","status":409,"body":{"error":"e","code":"CONFLICT"}}`},
		{appendReset(nil, []byte(`{"reason":"cursor_ahead"}`)), `{"type":"reset","data":{"reason":"cursor_ahead"}}`},
		// A client's frame id is echoed as encoding/json writes it.
		{appendReply(nil, "<a&b>\x01", 200, []byte(`{}`)), `{"type":"reply","id":"\u003ca\u0026b\u003e\u0001","status":200,"body":{}}`},
	} {
		if string(c.frame) != c.want {
			t.Errorf("frame %s, want %s", c.frame, c.want)
		}
	}
}

func TestMsgpackToJSON(t *testing.T) {
	mp := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		in   []byte
		want string
	}{
		{mp(nil), `null`},
		{mp(true), `true`},
		{mp(int8(-5)), `-5`},
		{mp(-200), `-200`},
		{mp(int64(math.MinInt64)), `-9223372036854775808`},
		{mp(uint64(math.MaxUint64)), `18446744073709551615`},
		{mp(1.5), `1.5`},
		{mp(float32(0.1)), `0.1`},
		{mp(1e21), `1e+21`},
		{mp(1e-7), `1e-7`},
		{mp("s\"\n"), `"s\"\n"`},
		{mp([]byte{0, 1, 2}), `"AAEC"`},
		{mp([]any{1, "a", nil}), `[1,"a",null]`},
		{mp(map[string]any{"k": map[string]any{"n": []any{}}}), `{"k":{"n":[]}}`},
		{mp(time.Unix(1700000000, 5).UTC()), `"2023-11-14T22:13:20.000000005Z"`},
		{mp(time.Unix(1700000000, 0).UTC()), `"2023-11-14T22:13:20Z"`},
		{mp(time.Unix(1<<40, 1).UTC()), `"36812-02-20T00:36:16.000000001Z"`},
	} {
		got, err := msgpackToJSON(c.in)
		if err != nil || string(got) != c.want {
			t.Errorf("% x: %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for name, in := range map[string][]byte{
		"empty":             {},
		"reserved code":     {0xc1},
		"truncated string":  {0xa5, 'a'},
		"4 GiB binary":      {0xc6, 0xff, 0xff, 0xff, 0xff, 0},
		"huge array":        {0xdd, 0xff, 0xff, 0xff, 0xff},
		"huge map":          {0xdf, 0x7f, 0xff, 0xff, 0xff, 0xc0},
		"integer key":       {0x81, 0x01, 0x02},
		"other extension":   {0xd4, 0x05, 0x00},
		"bad timestamp":     {0xd7, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"NaN":               mp(math.NaN()),
		"infinity":          mp(math.Inf(1)),
		"trailing bytes":    {0xc0, 0xc0},
		"too deep":          bytes.Repeat([]byte{0x91}, maxDepth+2),
		"truncated float64": {0xcb, 0, 0},
	} {
		if got, err := msgpackToJSON(in); err == nil {
			t.Errorf("%s: %s, want an error", name, got)
		}
	}
}

func TestJSONToMsgpack(t *testing.T) {
	var buf bytes.Buffer
	in := `{"b":[1,-2,18446744073709551615,1.5,1e400,"s",null,true],"a":{}}`
	if err := jsonToMsgpack(&buf, []byte(in)); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := msgpack.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	b := got["b"].([]any)
	if b[0] != int8(1) || b[1] != int8(-2) || b[2] != uint64(math.MaxUint64) || b[3] != 1.5 ||
		!math.IsInf(b[4].(float64), 1) || b[5] != "s" || b[6] != nil || b[7] != true || len(got["a"].(map[string]any)) != 0 {
		t.Fatalf("decoded %#v", got)
	}
	if err := jsonToMsgpack(&buf, []byte(`{`)); err == nil {
		t.Fatal("invalid JSON converted")
	}
}

func TestDecodeFrame(t *testing.T) {
	for _, f := range []wireFormat{formatJSON, formatMsgpack} {
		enc := func(v any) []byte {
			if f == formatJSON {
				b, _ := json.Marshal(v)
				return b
			}
			b, _ := msgpack.Marshal(v)
			return b
		}
		fr, err := decodeFrame(f, enc(map[string]any{"type": "command", "id": "c1", "command": "intent", "body": map[string]any{"x": 1}}))
		if err != nil || fr.Type != frameCommand || fr.ID != "c1" || fr.Command != "intent" || string(fr.Body) != `{"x":1}` {
			t.Fatalf("%d: command %+v, %v", f, fr, err)
		}
		fr, err = decodeFrame(f, enc(map[string]any{"type": "resume", "cursor": uint64(9), "epoch": "e"}))
		if err != nil || fr.Cursor != 9 || fr.Epoch != "e" {
			t.Fatalf("%d: resume %+v, %v", f, fr, err)
		}
		for _, c := range []struct {
			frame map[string]any
			id    string // the id an error reply goes to; "" closes with 1007
		}{
			{map[string]any{"type": "ack", "seq": 0, "id": "a"}, "a"},
			{map[string]any{"type": "ack", "seq": -1, "id": "a"}, "a"},
			{map[string]any{"type": "ack", "seq": 1, "id": 5}, ""},
			{map[string]any{"type": "nope", "id": "n"}, "n"},
			{map[string]any{"type": "nope"}, ""},
			{map[string]any{"type": "command", "command": "intent"}, ""},
			{map[string]any{"type": "command", "id": "c"}, "c"},
			{map[string]any{"type": "ack", "seq": 1, "id": strings.Repeat("i", maxFrameID+1)}, ""},
		} {
			_, err := decodeFrame(f, enc(c.frame))
			var fe *frameError
			if !errors.As(err, &fe) || fe.id != c.id {
				t.Errorf("%d: %v: %v, want an error for id %q", f, c.frame, err, c.id)
			}
		}
	}
}

// FuzzDecodeFrame checks that no input crashes the frame decoder or gets
// through it malformed, and that what it accepts survives a round trip
// through the other encoding unchanged.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"ack","seq":3}`,
		`{"type":"resume","cursor":12,"epoch":"e"}`,
		`{"type":"command","id":"c1","command":"intent","body":{"execution_id":"x","intent":{"type":"complete"}}}`,
		`{"type":"command","id":"c2","command":"result","body":{"data":[1,2.5,-3,"\u00e9",null,true]}}`,
		`{"type":"bogus","id":"b"}`,
		`[]`,
		`{"type":"ack","seq":"x","id":"q"}`,
	} {
		f.Add(false, []byte(s))
		var v any
		_ = json.Unmarshal([]byte(s), &v)
		b, _ := msgpack.Marshal(v)
		f.Add(true, b)
	}
	f.Add(true, []byte{0x81, 0xa4, 't', 'y', 'p', 'e', 0xc6, 0xff, 0xff, 0xff, 0xff})
	f.Add(true, []byte{0x82, 0xa4, 't', 'y', 'p', 'e', 0xa3, 'a', 'c', 'k', 0xa3, 's', 'e', 'q', 0xd7, 0xff, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, binary bool, data []byte) {
		format := formatJSON
		if binary {
			format = formatMsgpack
		}
		fr, err := decodeFrame(format, data)
		if err != nil {
			var fe *frameError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a frameError", err)
			}
			if fe.id != "" && !validFrameID(fe.id) {
				t.Fatalf("error reply to an invalid id %q", fe.id)
			}
			return
		}
		switch fr.Type {
		case frameAck:
			if fr.Seq == 0 {
				t.Fatal("ack of seq 0 accepted")
			}
		case frameResume:
		case frameCommand:
			if !validFrameID(fr.ID) || fr.Command == "" {
				t.Fatalf("command without id or name accepted: %+v", fr)
			}
		default:
			t.Fatalf("frame type %q accepted", fr.Type)
		}
		if len(fr.Body) > 0 && !json.Valid(fr.Body) {
			t.Fatalf("body %q is not JSON", fr.Body)
		}
		// A body is passed on as JSON; one whose numbers do not fit a
		// float64 has no msgpack form, and is not round-tripped.
		var probe any
		if len(fr.Body) > 0 && json.Unmarshal(fr.Body, &probe) != nil {
			return
		}
		// Encode the accepted frame in msgpack the way a client would, and
		// decode it again: the same frame must come back.
		canonical, err := json.Marshal(fr)
		if err != nil {
			t.Fatal(err)
		}
		var mp bytes.Buffer
		if err := jsonToMsgpack(&mp, canonical); err != nil {
			t.Fatalf("accepted frame does not convert to msgpack: %v", err)
		}
		again, err := decodeFrame(formatMsgpack, mp.Bytes())
		if err != nil {
			t.Fatalf("round trip of %s: %v", canonical, err)
		}
		if !sameFrame(fr, again) {
			t.Fatalf("round trip changed the frame:\n %+v\n %+v", fr, again)
		}
	})
}

// sameFrame compares frames, bodies as JSON values: the msgpack round trip
// may reorder keys or respell numbers.
func sameFrame(a, b inFrame) bool {
	ab, bb := a.Body, b.Body
	a.Body, b.Body = nil, nil
	if !reflect.DeepEqual(a, b) {
		return false
	}
	if len(ab) == 0 || len(bb) == 0 {
		return len(ab) == len(bb) || string(ab) == "null" || string(bb) == "null"
	}
	var av, bv any
	if json.Unmarshal(ab, &av) != nil || json.Unmarshal(bb, &bv) != nil {
		return false
	}
	return reflect.DeepEqual(av, bv)
}
