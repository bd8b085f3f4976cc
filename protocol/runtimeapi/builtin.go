package runtimeapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// memoryConsumer is the built-in memory runner's one connection.
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
func (s *Surface) Start(log *slog.Logger) {
	if len(s.memory) == 0 {
		return
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.stop, s.stopped = cancel, make(chan struct{})
	s.mu.Unlock()
	tools := make([]string, 0, len(s.memory))
	for name := range s.memory {
		tools = append(tools, name)
	}
	sort.Strings(tools)
	s.o.Kernel.Reserve(memoryRunner, tools)
	key := peer.Key{Role: kernel.RoleRunner, ID: memoryRunner, Consumer: memoryConsumer}
	conn, _ := s.o.Hub.Attach(key, nil, tools...)
	go func() {
		defer close(s.stopped)
		defer conn.Detach()
		s.serveMemory(ctx, conn, log)
	}()
}

// Close stops the memory runner and waits for the job it is running.
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

func (s *Surface) serveMemory(ctx context.Context, conn *peer.Conn, log *slog.Logger) {
	for {
		d, ok := conn.Wait(ctx)
		if !ok {
			return
		}
		if d.Type != event.PushJobAssigned {
			conn.Ack(d.Seq)
			continue
		}
		var j struct {
			ID          string          `json:"id"`
			ExecutionID string          `json:"execution_id"`
			StepID      string          `json:"step_id"`
			ToolID      string          `json:"tool_id"`
			Arguments   json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(d.Data, &j); err != nil {
			log.Warn("memory runner: malformed job dropped", "err", err)
			conn.Ack(d.Seq)
			continue
		}
		if s.runMemoryJob(ctx, j.ID, j.ExecutionID, j.StepID, j.ToolID, j.Arguments, log) {
			conn.Ack(d.Seq)
		}
	}
}

// runMemoryJob runs one memory tool call for the execution's tenant and
// records its result. It reports whether the job is settled: false leaves
// it to be delivered again (the process is stopping, or the store failed).
func (s *Surface) runMemoryJob(ctx context.Context, jobID, execID, stepID, tool string, args json.RawMessage, log *slog.Logger) bool {
	v, err := s.o.Kernel.Get(ctx, execID)
	if err != nil {
		return true // gone: the kernel dropped its jobs
	}
	res := kernel.RunnerResultRequest{JobID: jobID, ExecutionID: execID, StepID: stepID, ConsumerID: memoryConsumer}
	out, err := s.o.Memory.Call(ctx, v.Tenant, tool, args)
	if ctx.Err() != nil {
		return false // stopping: the job is delivered again at the next start
	}
	if err != nil {
		res.Error = err.Error()
	} else {
		res.Success, res.Data = true, out
	}
	after, err := s.o.Kernel.RunnerResult(ctx, memoryRunner, res, kernel.Meta{Principal: memoryRunner, Tenant: v.Tenant})
	if errors.Is(err, kernel.ErrConflict) || errors.Is(err, kernel.ErrNotFound) {
		return true // answered or ended meanwhile
	}
	if err != nil {
		log.Warn("memory runner: result not recorded", "execution", execID, "step", stepID, "err", err)
		return false
	}
	after.Run()
	return true
}
