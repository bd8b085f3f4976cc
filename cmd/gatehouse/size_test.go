package main

import "testing"

func TestByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"0", 0, false},
		{"1048576", 1 << 20, false},
		{"64MiB", 64 << 20, false},
		{"64MB", 64_000_000, false},
		{"2GiB", 2 << 30, false},
		{"512k", 512_000, false},
		{"1.5GiB", 3 << 29, false},
		{"lots", 0, true},
		{"-5MiB", 0, true},
		{"100EiB", 0, true},
	} {
		var b byteSize
		err := b.Set(tc.in)
		if (err != nil) != tc.err || (err == nil && int64(b) != tc.want) {
			t.Errorf("Set(%q) = %d, %v; want %d (error %v)", tc.in, b, err, tc.want, tc.err)
		}
	}
}
