package main

import (
	"flag"
	"io"
	"reflect"
	"testing"
)

// TestChannelRespondersFlag: --channel-responders takes rule=people
// groups, several in one value (as one environment variable must) or
// repeated, and refuses a group without a rule or people.
func TestChannelRespondersFlag(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.flags(fs)
	if err := fs.Parse([]string{"--channel-responders", "ask=bob, carol;prod=dana", "--channel-responders", "brief=erin"}); err != nil {
		t.Fatal(err)
	}
	want := responders{"ask": {"bob", "carol"}, "prod": {"dana"}, "brief": {"erin"}}
	if !reflect.DeepEqual(c.responders, want) {
		t.Fatalf("parsed %v, want %v", c.responders, want)
	}
	if got := c.responders.String(); got != "ask=bob,carol;brief=erin;prod=dana" {
		t.Fatalf("String: %q", got)
	}
	for _, bad := range []string{"ask", "ask=", "=bob", "ask= , "} {
		var r responders
		if err := r.Set(bad); err == nil {
			t.Errorf("%q accepted: %v", bad, r)
		}
	}
}
