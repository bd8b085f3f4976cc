package channel

import (
	"context"
	"strings"
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

// ForgetCards deletes, in st, the records of actionID's cards: what a
// gateway killed between a card's send and its record's commit leaves.
func ForgetCards(st *store.Store, actionID string) error {
	var b store.Batch
	_ = st.Records(kindCard, func(id string, _ func(any) error) bool {
		if i := strings.LastIndexByte(id, '|'); i >= 0 && id[i+1:] == actionID {
			b.Delete(kindCard, id)
		}
		return true
	})
	return st.Write(context.Background(), &b)
}
