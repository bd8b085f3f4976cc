package node

import (
	"context"
	"time"
)

// startRetention runs retention now and then on its own goroutine and
// returns its release: that cancels the pass in progress, if any, and
// waits for the goroutine to end.
func (n *Node) startRetention() func(context.Context) error {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.retentionLoop(ctx)
	}()
	return func(context.Context) error {
		stop()
		<-done
		return nil
	}
}

// retentionLoop runs retention now and then, until ctx ends.
func (n *Node) retentionLoop(ctx context.Context) {
	interval := n.o.RetentionInterval
	t := time.NewTimer(min(FirstRetention, interval))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.retain(ctx)
			t.Reset(interval)
		case <-ctx.Done():
			return
		}
	}
}

// retain prunes finished executions past retention, sessions' logs and
// expired idempotency keys; when it deleted anything, the store compacts,
// so that the folder gives the space back (see store.Compact).
func (n *Node) retain(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	executions, err := n.Kernel.Prune(ctx, start.Add(-n.o.Retention), n.o.RetentionCount)
	if err != nil {
		n.log.Warn("retention", "err", err)
	}
	sessions, err := n.Sessions.Prune(ctx, start)
	if err != nil {
		n.log.Warn("session retention", "err", err)
	}
	keys, err := n.Kernel.ExpireIdempotencyKeys(ctx)
	if err != nil {
		n.log.Warn("idempotency keys", "err", err)
	}
	if executions+sessions+keys == 0 {
		if err := n.Store.RunGC(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("retention: value log collection", "err", err)
		}
		return
	}
	if err := n.Store.Compact(ctx); err != nil && ctx.Err() == nil {
		n.log.Warn("retention: compaction", "err", err)
	}
	n.log.Info("retention", "executions", executions, "sessions", sessions, "idempotency_keys", keys,
		"took", time.Since(start).Round(time.Millisecond))
}
