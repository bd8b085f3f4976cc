package node

import "testing"

func TestJournalPurgeKeepsWhatANodeLacksEmbeddedOrOnADeployment(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peers []string
		all   map[string]uint64
		want  uint64
	}{
		{"every peer reported", []string{"n1", "n2", "n3"}, map[string]uint64{"n1": 9, "n2": 7, "n3": 8}, 7},
		{"a peer that has not reported holds all back", []string{"n1", "n2", "n3"}, map[string]uint64{"n1": 9, "n2": 7}, 0},
		{"a node that left the meta group does not", []string{"n1", "n2"}, map[string]uint64{"n1": 9, "n2": 7, "old": 1}, 7},
		{"a deployment joined by URL: every node that reported", nil, map[string]uint64{"n1": 9, "n2": 7, "n3": 8}, 7},
		{"a deployment joined by URL: a node that lags", nil, map[string]uint64{"n1": 9, "n2": 2}, 2},
		{"a deployment joined by URL: none reported", nil, map[string]uint64{}, 0},
	} {
		if got := purgeBelow(tc.peers, tc.all); got != tc.want {
			t.Errorf("%s: purge below %d, want %d", tc.name, got, tc.want)
		}
	}
}
