package gateway_test

import (
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/node"
)

// TestRetentionRunsSoonAfterStart: retention's first pass does not wait
// for a full interval, and it runs again every interval after it.
func TestRetentionRunsSoonAfterStart(t *testing.T) {
	s := start(t, node.Options{Retention: time.Millisecond, RetentionInterval: 200 * time.Millisecond})
	a := newAPI(t, s)
	for round := range 2 {
		id := a.create("ret-agent", nil)["id"].(string)
		a.json("POST", "/v0/executions/"+id+"/cancel", nil, 200)
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, _, _ := a.do("GET", "/v0/executions/"+id, nil)
			if status == 404 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the finished execution was not pruned within 10s (%d)", round, status)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
