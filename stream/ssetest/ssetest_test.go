package ssetest_test

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

func TestReaderReadsFramesAsWritten(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		want  []ssetest.Frame
		retry string
		err   error
	}{
		{name: "fields", body: "id: 7\nevent: e\ndata: {}\n\n",
			want: []ssetest.Frame{{ID: "7", Event: "e", Data: "{}"}}, err: io.EOF},
		{name: "nothing carried over or invented", body: "id: 1\nevent: a\ndata: 1\n\ndata: 2\n\n",
			want: []ssetest.Frame{{ID: "1", Event: "a", Data: "1"}, {Data: "2"}}, err: io.EOF},
		{name: "data lines joined", body: "event: m\ndata: a\ndata:b\ndata\n\n",
			want: []ssetest.Frame{{Event: "m", Data: "a\nb\n"}}, err: io.EOF},
		{name: "an id alone is a frame", body: "id: 3\n\n",
			want: []ssetest.Frame{{ID: "3"}}, err: io.EOF},
		{name: "heartbeats and retry advice are none", body: "retry: 5000\n\n:\n\n:heartbeat\n\nevent: e\ndata: x\n\n",
			want: []ssetest.Frame{{Event: "e", Data: "x"}}, retry: "5000", err: io.EOF},
		{name: "CRLF", body: "event: e\r\ndata: x\r\n\r\n",
			want: []ssetest.Frame{{Event: "e", Data: "x"}}, err: io.EOF},
		{name: "a cut frame is dropped", body: "event: e\ndata: x\n\nevent: f\ndata: y\n",
			want: []ssetest.Frame{{Event: "e", Data: "x"}}, err: io.EOF},
		{name: "unknown field", body: "event: e\nvalue: 1\n\n", err: ssetest.ErrField},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ssetest.NewReader(strings.NewReader(tt.body))
			got, err := r.Frames(-1)
			if !errors.Is(err, tt.err) || !reflect.DeepEqual(got, tt.want) || r.Retry() != tt.retry {
				t.Fatalf("frames %+v, retry %q, %v; want %+v, %q, %v", got, r.Retry(), err, tt.want, tt.retry, tt.err)
			}
		})
	}
}
