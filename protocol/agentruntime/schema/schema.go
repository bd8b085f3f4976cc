// Package schema holds the Agent Runtime standard's own JSON Schemas
// (draft 2020-12), vendored unchanged from limecloud/agentruntime at
// v0.3.9 (commit 65ae1ec, docs/public/schemas) under the standard's Apache
// License 2.0 (LICENSE beside them): what a consumer validating Gatehouse's
// events and snapshots demands. Tests and the conformance suite validate
// against them.
package schema

import (
	"bytes"
	_ "embed"
)

// Schema ids, as the schemas declare them.
const (
	EventID    = "https://agentruntime.example/schemas/agentruntime-event.schema.json"
	SnapshotID = "https://agentruntime.example/schemas/agentruntime-snapshot.schema.json"
)

var (
	//go:embed agentruntime-event.schema.json
	event []byte
	//go:embed agentruntime-snapshot.schema.json
	snapshot []byte
)

// Event returns agentruntime-event.schema.json.
func Event() []byte { return bytes.Clone(event) }

// Snapshot returns agentruntime-snapshot.schema.json.
func Snapshot() []byte { return bytes.Clone(snapshot) }
