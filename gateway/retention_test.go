package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/node"
)

// TestRetentionRunsSoonAfterStart: retention's first pass does not wait
// for a full interval, and it runs again every interval after it.
func TestRetentionRunsSoonAfterStart(t *testing.T) {
	t.Parallel()
	s := start(t, node.Options{Retention: time.Millisecond, RetentionInterval: 200 * time.Millisecond})
	a := newAPI(t, s)
	for round := range 2 {
		id := a.create("ret-agent", nil)["id"].(string)
		a.json("POST", "/v0/executions/"+id+"/cancel", nil, 200)
		eventually.Check(t, func() error {
			if status, _, _ := a.do("GET", "/v0/executions/"+id, nil); status != 404 {
				return fmt.Errorf("round %d: the finished execution was not pruned (%d)", round, status)
			}
			return nil
		})
	}
}
