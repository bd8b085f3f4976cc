package agentruntime

import "encoding/json"

// FoldEvents folds encoded events into fresh read models, for benchmarks.
func FoldEvents(sessionID string, events []json.RawMessage) error {
	m := newModel(sessionID)
	for _, e := range events {
		if err := m.fold(e); err != nil {
			return err
		}
	}
	return nil
}
