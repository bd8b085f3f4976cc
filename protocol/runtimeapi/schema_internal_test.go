package runtimeapi

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestSchemaReferencesStayInTheDocument: a tool's parameters resolve
// references within the schema the runner sent, and nowhere else. A
// reference to a file that exists and one to a file that does not are
// refused alike, with one error that does not even name the URL, without
// the file being read; so are relative references, a $schema elsewhere and
// http URLs.
func TestSchemaReferencesStayInTheDocument(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "secret.json")
	if err := os.WriteFile(existing, []byte(`{"type":"object","required":["secret"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "none.json")
	var c schemaCache
	refused := func(schema string) {
		t.Helper()
		_, err := c.compile(json.RawMessage(schema))
		if err != errExternalRef {
			t.Fatalf("compile %s: %v, want exactly errExternalRef", schema, err)
		}
	}
	for _, form := range []string{`{"$ref":%s}`, `{"type":"object","properties":{"a":{"$ref":%s}}}`, `{"$schema":%s}`} {
		for _, f := range []string{existing, missing} {
			refused(fmt.Sprintf(form, quote("file://"+f)))
		}
	}
	refused(`{"$ref":"secret.json"}`)
	refused(`{"$ref":"http://127.0.0.1:1/schema.json"}`)

	// Both answer an invocation the same way: the input goes to the runner
	// unchecked, as for any schema that does not compile.
	for _, f := range []string{existing, missing} {
		if err := c.validate(json.RawMessage(`{"$ref":`+quote("file://"+f)+`}`), json.RawMessage(`{}`)); err != nil {
			t.Fatalf("input checked against %s: %v", f, err)
		}
	}
	// A reference within the document still works.
	local := `{"$defs":{"n":{"type":"integer"}},"type":"object","properties":{"a":{"$ref":"#/$defs/n"}}}`
	if err := c.validate(json.RawMessage(local), json.RawMessage(`{"a":"x"}`)); err == nil {
		t.Fatal("an input breaking an in-document reference passed")
	}
	if err := c.validate(json.RawMessage(local), json.RawMessage(`{"a":1}`)); err != nil {
		t.Fatalf("an input meeting an in-document reference: %v", err)
	}
}

// quote is s as a JSON string.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
