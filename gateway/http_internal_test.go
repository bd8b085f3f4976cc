package gateway

import "testing"

func TestTraceID(t *testing.T) {
	for _, tc := range []struct{ header, want string }{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "4bf92f3577b34da6a3ce929d0e0e4736"}, // future versions may add fields
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},                                       // version ff is invalid
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},                                       // all-zero trace id
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},                                       // upper case
		{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", ""},                                        // short
		{"00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01", ""},                                       // not hex
		{"", ""},
		{"garbage", ""},
	} {
		if got := traceID([]byte(tc.header)); got != tc.want {
			t.Errorf("traceID(%q) = %q, want %q", tc.header, got, tc.want)
		}
	}
}
