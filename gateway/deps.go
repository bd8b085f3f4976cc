package gateway

import (
	"context"
	"encoding/json"

	"github.com/gatehouse-dev/gatehouse/bridge"
	"github.com/gatehouse-dev/gatehouse/channel"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/peer"
)

// What the gateway needs of the packages below it, as it uses them; the
// node passes the real ones (*kernel.Kernel, *peer.Hub, *bridge.Bridge,
// *channel.Registry).

// Kernel is the execution kernel: the /v0 commands and reads, and the
// execution streams.
type Kernel interface {
	Create(ctx context.Context, req kernel.CreateRequest, meta kernel.Meta) (v kernel.View, replayed bool, err error)
	Get(ctx context.Context, id string) (kernel.View, error)
	List(ctx context.Context, req kernel.ListRequest) (kernel.ListPage, error)
	Events(ctx context.Context, id string, after uint64, limit int) (kernel.EventPage, error)
	Cancel(ctx context.Context, id string, meta kernel.Meta) (kernel.View, error)
	Signal(ctx context.Context, id string, req kernel.SignalRequest, meta kernel.Meta) (kernel.After, error)
	Intent(ctx context.Context, req kernel.IntentRequest, meta kernel.Meta) (kernel.IntentResult, kernel.After, error)
	Say(ctx context.Context, req kernel.IntentRequest, meta kernel.Meta) (<-chan error, error)
	StepResult(ctx context.Context, req kernel.StepResultRequest, meta kernel.Meta) (kernel.After, error)
	StepStarted(ctx context.Context, stepID string, req kernel.StepStartedRequest, meta kernel.Meta) error
	RunnerResult(ctx context.Context, runnerID string, req kernel.RunnerResultRequest, meta kernel.Meta) (kernel.After, error)
	ResolveApproval(ctx context.Context, execID, actionID string, d kernel.Decision, meta kernel.Meta) (kernel.After, error)
	ApprovalOf(execID, stepID string) string
	Declare(ctx context.Context, agentID string, info json.RawMessage) error
	DescribeTools(runnerID string, info map[string]json.RawMessage)
	UpdateCapabilities(runnerID string, tools []string)
	RunnerCapabilities(runnerID string) []string
	RemoveRunner(runnerID string)
	ReservedTool(capability string) (runnerID string, reserved bool)
	BuiltinRunner(runnerID string) bool

	AppendEvents(dst []byte, id string, after uint64, max int, fn func(seq uint64, typ string, data []byte) bool) ([]byte, error)
	Watch(id string) *kernel.Watch
	Live(id string) bool
	Epoch() string
	Ready(ctx context.Context) error
	Stats() kernel.Stats
}

// Hub is the peer hub: consumers' outboxes and who is connected.
type Hub interface {
	Attach(k peer.Key, cursor *uint64, caps ...string) (*peer.Conn, *peer.Reset)
	Ack(k peer.Key, seq uint64) bool
	// Flush returns once every acknowledgement made so far is durable.
	Flush() error
	Peers(q peer.Query) (page []peer.Info, more bool)
	Stats() peer.Stats
}

// Bridge is the permission bridge's read side; answers go through the
// kernel.
type Bridge interface {
	Get(actionID string) (bridge.Record, error)
	List(ctx context.Context, state string, visible func(*bridge.Record) bool, after string, limit int) ([]bridge.Record, string, error)
	Pending(owner string) []bridge.Record
}

// Channels is the registry of people's channels.
type Channels interface {
	Connect(ctx context.Context, owner, channelID, peerID string) (ch channel.Channel, fresh bool, err error)
	Backfill(ctx context.Context, ch channel.Channel, prompts []bridge.Record) error
	List(owner string) []channel.Channel
	Events(owner string, after uint64, limit int) ([]json.RawMessage, uint64, error)
	Message(owner, channelID, peerID string, body json.RawMessage) error
	SetWebhook(ctx context.Context, owner, rawURL, secret string) (ch channel.Channel, fresh bool, err error)
	RemoveWebhook(ctx context.Context, owner string) error
}
