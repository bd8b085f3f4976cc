package store

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestEachRecord walks records of one kind under a prefix: in id order,
// decoded, stopping when asked; a record that does not decode and a
// cancelled context each end the walk with an error instead of passing for
// a shorter walk.
func TestEachRecord(t *testing.T) {
	type note struct{ N int }
	s := open(t, t.TempDir(), SyncNone)
	defer s.Close()
	var b Batch
	for id, n := range map[string]int{"a/2": 2, "a/1": 1, "a/3": 3, "b/1": 10} {
		if err := b.Put("note", id, note{n}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Put("other", "a/9", note{9}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	walk := func(ctx context.Context, prefix string, stopAfter int) ([]string, error) {
		var seen []string
		err := EachRecord(ctx, s, "note", prefix, func(id string, v *note) bool {
			seen = append(seen, id+"="+strings.Repeat("x", v.N))
			return len(seen) != stopAfter
		})
		return seen, err
	}
	for _, tc := range []struct {
		name      string
		prefix    string
		stopAfter int
		want      []string
	}{
		{"prefix, in id order", "a/", 0, []string{"a/1=x", "a/2=xx", "a/3=xxx"}},
		{"every record of the kind", "", 0, []string{"a/1=x", "a/2=xx", "a/3=xxx", "b/1=xxxxxxxxxx"}},
		{"stopped by fn", "a/", 2, []string{"a/1=x", "a/2=xx"}},
		{"no match", "c/", 0, nil},
	} {
		got, err := walk(t.Context(), tc.prefix, tc.stopAfter)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if got, err := walk(ctx, "", 0); !errors.Is(err, context.Canceled) || len(got) != 0 {
		t.Errorf("cancelled walk: got %q, %v; want nothing and context.Canceled", got, err)
	}

	var bad Batch
	if err := bad.Put("note", "a/0", "not a note"); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(t.Context(), &bad); err != nil {
		t.Fatal(err)
	}
	if got, err := walk(t.Context(), "a/", 0); err == nil || !strings.Contains(err.Error(), "note/a/0") || len(got) != 0 {
		t.Errorf("undecodable record: got %q, %v; want nothing and an error naming note/a/0", got, err)
	}
}

// TestRecordsAfter walks a kind from the first id greater than the one
// given, in id order, and decodes only the records asked for: the walk
// goes on where an earlier one stopped.
func TestRecordsAfter(t *testing.T) {
	s := open(t, t.TempDir(), SyncNone)
	defer s.Close()
	var b Batch
	for _, id := range []string{"a", "b", "b/1", "c", "d"} {
		if err := b.Put("note", id, id+"!"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Put("notes", "a", "another kind"); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		after string
		want  []string
	}{
		{"", []string{"a=a!", "b", "b/1=b/1!", "c", "d=d!"}},
		{"a", []string{"b", "b/1=b/1!", "c", "d=d!"}},
		{"b/0", []string{"b/1=b/1!", "c", "d=d!"}},
		{"b/1", []string{"c", "d=d!"}},
		{"d", nil},
		{"z", nil},
	} {
		var got []string
		err := s.RecordsAfter("note", tc.after, func(id string, decode func(any) error) bool {
			if id == "b" || id == "c" {
				got = append(got, id) // skipped unread
				return true
			}
			var v string
			if err := decode(&v); err != nil {
				t.Fatal(err)
			}
			got = append(got, id+"="+v)
			return true
		})
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("after %q: got %q, %v; want %q", tc.after, got, err, tc.want)
		}
	}
}
