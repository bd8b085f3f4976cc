package kernel

import "github.com/gatehouse-dev/gatehouse/internal/watch"

// Watch tells a reader that an execution's log grew. It carries no events:
// the reader reads them after the last sequence it sent (ReadEvents: from
// the execution's tail in memory, or the store), so a slow reader costs no
// memory and cannot miss anything. Its Done closes when the kernel shuts
// down.
type Watch = watch.Watch

// Watch starts watching execution id. Call it before reading the backlog so
// that nothing appended in between is missed.
func (k *Kernel) Watch(id string) *Watch { return k.watches.Watch(id) }
