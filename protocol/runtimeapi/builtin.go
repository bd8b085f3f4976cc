package runtimeapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// memoryConsumer is the built-in memory runner's first connection; the
// others are memoryConsumer-1, memoryConsumer-2 and so on.
const memoryConsumer = "builtin"

// Start runs the built-in memory runner until Close: an in-process runner
// that serves the memory tools through the kernel like any runner, so
// that a memory invocation goes through policy and the bridge, and its job
// survives a restart in the runner's durable outbox (a job taken but not
// answered when the process stops is delivered again at the next start).
//
// The memory tools' names, and the runner's id, are reserved for it first:
// a job of a memory tool carries another tenant's notes query or note, and
// must reach no runner but this one. Call Start before the server serves.
//
// The kernel hands a connection one job at a time, so the runner attaches
// as many connections as the memory holds calls at once (its Capacity):
// the memory, not the kernel's queue, decides which tenant's call runs
// next (see memory.Notes.Call).
func (s *Surface) Start(log *slog.Logger) {
	if len(s.memory) == 0 {
		return
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	s.mu.Lock()
	s.stop, s.stopped = cancel, stopped
	s.mu.Unlock()
	tools := make([]string, 0, len(s.memory))
	for name := range s.memory {
		tools = append(tools, name)
	}
	sort.Strings(tools)
	s.o.Kernel.Reserve(memoryRunner, tools)
	var wg sync.WaitGroup
	for i := range max(1, s.o.Memory.Capacity()) {
		consumer := memoryConsumer
		if i > 0 {
			consumer += "-" + strconv.Itoa(i)
		}
		conn, _ := s.o.Hub.Attach(peer.Key{Role: kernel.RoleRunner, ID: memoryRunner, Consumer: consumer}, nil, tools...)
		wg.Go(func() {
			defer conn.Detach()
			s.serveMemory(ctx, conn, consumer, log)
		})
	}
	go func() {
		wg.Wait()
		close(stopped)
	}()
}

// Close stops the memory runner and waits for the jobs it is running.
func (s *Surface) Close() {
	s.mu.Lock()
	stop, stopped := s.stop, s.stopped
	s.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-stopped
}

func (s *Surface) serveMemory(ctx context.Context, conn *peer.Conn, consumer string, log *slog.Logger) {
	for {
		d, ok := conn.Wait(ctx)
		if !ok {
			return
		}
		if d.Type != event.PushJobAssigned {
			conn.Ack(d.Seq)
			continue
		}
		var j memoryJob
		if err := json.Unmarshal(d.Data, &j); err != nil {
			log.Warn("memory runner: malformed job dropped", "err", err)
			conn.Ack(d.Seq)
			continue
		}
		if s.runMemoryJob(ctx, &j, consumer, log) {
			conn.Ack(d.Seq)
		}
	}
}

// memoryJob is what the memory runner reads of a job.
type memoryJob struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	StepID      string          `json:"step_id"`
	ToolID      string          `json:"tool_id"`
	Arguments   json.RawMessage `json:"arguments"`
	Deadline    time.Time       `json:"deadline"`
}

// runMemoryJob runs one memory tool call for the execution's owner and
// records its result. It reports whether the job is settled: false leaves
// it to be delivered again (the process is stopping, or the store failed).
// The call is cancelled at the job's deadline and when the execution ends
// (cancelled, timed out), whether it waits for its turn or runs; a memory
// too busy to queue it fails the attempt as retryable.
func (s *Surface) runMemoryJob(ctx context.Context, j *memoryJob, consumer string, log *slog.Logger) bool {
	v, err := s.o.Kernel.Get(ctx, j.ExecutionID)
	if err != nil || v.Status.Terminal() {
		return true // gone or ended: the kernel dropped its jobs
	}
	res := kernel.RunnerResultRequest{JobID: j.ID, ExecutionID: j.ExecutionID, StepID: j.StepID, ConsumerID: consumer}
	out, err := s.callMemory(ctx, j, memory.Owner{Tenant: v.Tenant, Principal: v.Owner})
	if ctx.Err() != nil {
		return false // stopping: the job is delivered again at the next start
	}
	switch {
	case err == nil:
		res.Success, res.Data = true, out
	case errors.Is(err, memory.ErrBusy):
		res.Error, res.Retryable = err.Error(), true
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		res.Error = "memory call cancelled: its deadline passed or its execution ended"
	default:
		res.Error = err.Error()
	}
	after, err := s.o.Kernel.RunnerResult(ctx, memoryRunner, res, kernel.Meta{Principal: memoryRunner, Tenant: v.Tenant})
	if errors.Is(err, kernel.ErrConflict) || errors.Is(err, kernel.ErrNotFound) {
		return true // answered or ended meanwhile
	}
	if err != nil {
		log.Warn("memory runner: result not recorded", "execution", j.ExecutionID, "step", j.StepID, "err", err)
		return false
	}
	after.Run()
	return true
}

// callMemory runs j's call for owner with a context that ends at j's
// deadline, when j's execution ends, or when ctx does.
func (s *Surface) callMemory(ctx context.Context, j *memoryJob, owner memory.Owner) (json.RawMessage, error) {
	callCtx, cancel := context.WithCancel(ctx)
	if !j.Deadline.IsZero() {
		callCtx, cancel = context.WithDeadline(ctx, j.Deadline)
	}
	defer cancel()
	w := s.o.Kernel.Watch(j.ExecutionID)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer w.Stop()
		for {
			select {
			case <-callCtx.Done():
				return
			case <-w.Done():
				return
			case <-w.C():
				if v, err := s.o.Kernel.Get(callCtx, j.ExecutionID); err != nil || v.Status.Terminal() {
					cancel()
					return
				}
			}
		}
	}()
	// A watch started after the execution ended never fires: look once.
	if v, err := s.o.Kernel.Get(callCtx, j.ExecutionID); err != nil || v.Status.Terminal() {
		cancel()
	}
	out, err := s.o.Memory.Call(callCtx, owner, j.ToolID, j.Arguments)
	cancel()
	<-ended
	return out, err
}
