package channel

import (
	"context"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// WritePress records, in st, an answer to actionID received through
// adapter's dest and not decided: what a gateway killed between the two
// leaves behind.
func WritePress(st *store.Store, actionID, adapter, dest string) error {
	var b store.Batch
	_ = b.Put(kindPress, actionID+"|"+adapter+"|"+dest, &press{ActionID: actionID, Adapter: adapter, Dest: dest, At: time.Now()})
	return st.Write(context.Background(), &b)
}
