package channel_test

import (
	"encoding/json"
	"testing"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/kernel"
)

// TestCardArgumentsShowTheExactCharacters: a card shows the arguments a
// person approves as they are: the characters Go's encoder escapes appear
// as themselves, an escaped backslash stays escaped, and a long text is cut
// on a character, not inside one.
func TestCardArgumentsShowTheExactCharacters(t *testing.T) {
	args, _ := json.Marshal(map[string]string{"a": "<b>&", "c": `\u003c`})
	rec := bridge.Record{Approval: kernel.Approval{Arguments: args}}
	want := "{\n  \"a\": \"<b>&\",\n  \"c\": \"\\\\u003c\"\n}"
	if got := channel.Arguments(rec, 1000); got != want {
		t.Fatalf("arguments:\n%s\nwant:\n%s", got, want)
	}
	if got := channel.Clip("ééé", 5); got != "é…" {
		t.Fatalf("clip: %q", got)
	}
	if got := channel.Arguments(bridge.Record{}, 10); got != "(no arguments)" {
		t.Fatalf("no arguments: %q", got)
	}
}
