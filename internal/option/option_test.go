package option

import (
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	for _, tc := range []struct {
		v, d, want time.Duration
	}{
		{0, time.Second, time.Second},
		{-time.Millisecond, time.Second, time.Second},
		{time.Millisecond, time.Second, time.Millisecond},
	} {
		v := tc.v
		Default(&v, tc.d)
		if v != tc.want {
			t.Errorf("Default(%v, %v) = %v, want %v", tc.v, tc.d, v, tc.want)
		}
	}
	n := 0
	Default(&n, 8)
	if n != 8 {
		t.Errorf("Default(0, 8) = %d", n)
	}
}
