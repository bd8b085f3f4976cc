package cluster

import "testing"

func TestRedactedURLsShowNoPasswordNorToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://gh:s3cret@a:4222,tls://gh:s3cret@b:4222", "nats://gh:xxxxx@a:4222,tls://gh:xxxxx@b:4222"},
		{"nats://s3cret@a:4222", "nats://xxxxx@a:4222"},
		{"nats://a:4222, nats://gh:s3cret@b:4222", "nats://a:4222,nats://gh:xxxxx@b:4222"},
		{"nats://gh:s3cret@a:4222/%zz", "(a URL that does not parse)"},
	} {
		if got := redactURLs(tc.in); got != tc.want {
			t.Errorf("redactURLs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
