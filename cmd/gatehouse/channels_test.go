package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/gatehouse-dev/gatehouse/node"
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
	if !reflect.DeepEqual(c.channels.responders, want) {
		t.Fatalf("parsed %v, want %v", c.channels.responders, want)
	}
	if got := c.channels.responders.String(); got != "ask=bob,carol;brief=erin;prod=dana" {
		t.Fatalf("String: %q", got)
	}
	for _, bad := range []string{"ask", "ask=", "=bob", "ask= , "} {
		var r responders
		if err := r.Set(bad); err == nil {
			t.Errorf("%q accepted: %v", bad, r)
		}
	}
}

// TestTelegramFlags: the Telegram flags fill node.Options.Telegram; a
// token without users, or users without a token, is refused.
func TestTelegramFlags(t *testing.T) {
	parse := func(args ...string) (node.Options, error) {
		var c config
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.flags(fs)
		if err := fs.Parse(args); err != nil {
			return node.Options{}, err
		}
		var o node.Options
		return o, c.channels.apply(&o)
	}
	o, err := parse("--telegram-token", "1:abc", "--telegram-users", "111=alice, 222=bob", "--telegram-chats", "bob=-100777,bob=222")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{111: "alice", 222: "bob"}
	if o.Telegram == nil || !reflect.DeepEqual(o.Telegram.Users, want) || !reflect.DeepEqual(o.Telegram.Chats["bob"], []int64{-100777, 222}) {
		t.Fatalf("telegram options: %+v", o.Telegram)
	}
	for _, args := range [][]string{
		{"--telegram-token", "1:abc"},
		{"--telegram-users", "111=alice"},
		{"--telegram-token", "1:abc", "--telegram-users", "alice=111"},
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if o, err := parse(); err != nil || o.Telegram != nil {
		t.Fatalf("no flags: %v %+v", err, o.Telegram)
	}
}

// TestSlackFlags: the Slack flags fill node.Options.Slack; a token
// without the signing secret or without users is refused.
func TestSlackFlags(t *testing.T) {
	parse := func(args ...string) (node.Options, error) {
		var c config
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.flags(fs)
		if err := fs.Parse(args); err != nil {
			return node.Options{}, err
		}
		var o node.Options
		return o, c.channels.apply(&o)
	}
	o, err := parse("--slack-token", "xoxb-1", "--slack-signing-secret", "s", "--slack-users", "U1=alice,U2=bob", "--slack-conversations", "alice=C1,alice=C2")
	if err != nil {
		t.Fatal(err)
	}
	if o.Slack == nil || o.Slack.Users["U2"] != "bob" || !reflect.DeepEqual(o.Slack.Conversations["alice"], []string{"C1", "C2"}) {
		t.Fatalf("slack options: %+v", o.Slack)
	}
	for _, args := range [][]string{
		{"--slack-token", "xoxb-1", "--slack-users", "U1=alice"},
		{"--slack-token", "xoxb-1", "--slack-signing-secret", "s"},
		{"--slack-users", "U1=alice"},
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestWebPushFlags: --webpush turns the Web Push channel on, with its
// subject; a subject alone is refused.
func TestWebPushFlags(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.flags(fs)
	if err := fs.Parse([]string{"--webpush", "--webpush-subject", "mailto:ops@example.com"}); err != nil {
		t.Fatal(err)
	}
	var o node.Options
	if err := c.channels.apply(&o); err != nil || o.WebPush == nil || o.WebPush.Subject != "mailto:ops@example.com" {
		t.Fatalf("%v %+v", err, o.WebPush)
	}
	c.channels.webpush = false
	if err := c.channels.apply(&node.Options{}); err == nil {
		t.Fatal("a subject without --webpush accepted")
	}
}
