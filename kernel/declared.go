package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gatehouse-dev/gatehouse/store"
)

// kindAgentInfo keeps what agents declare about themselves.
const kindAgentInfo = "agentinfo" // agent id -> declaration

// maxAgentInfo bounds one agent's declaration.
const maxAgentInfo = 256 << 10

// Declaration is what an agent declares about itself, in a protocol's own
// terms (an Agent Application Protocol agent's AgentInfo, say): the kernel
// keeps it durably and says whether the agent is online, and means nothing
// by it.
type Declaration struct {
	AgentID string          `json:"agent_id" msgpack:"a"`
	Info    json.RawMessage `json:"info" msgpack:"i"`
	At      time.Time       `json:"declared_at" msgpack:"t"`
	// Online says that a consumer of the agent is connected now.
	Online bool `json:"online" msgpack:"-"`
}

// Declare records agentID's declaration, replacing an earlier one. It
// returns once durable.
func (k *Kernel) Declare(ctx context.Context, agentID string, info json.RawMessage) error {
	if agentID == "" {
		return invalid("agent_id is required")
	}
	if err := checkID("agent_id", agentID, maxIDLen); err != nil {
		return err
	}
	if len(info) > maxAgentInfo || !json.Valid(info) {
		return invalid("an agent's declaration is one JSON value of at most %d bytes", maxAgentInfo)
	}
	var b store.Batch
	if err := b.Put(kindAgentInfo, agentID, &Declaration{AgentID: agentID, Info: info, At: k.now()}); err != nil {
		return err
	}
	if err := k.store.Write(ctx, &b); err != nil {
		if errors.Is(err, ErrStorageFull) {
			return err
		}
		return newErr(ErrUnavailable, "service unavailable: %v", err)
	}
	return nil
}

// Declarations returns every agent's declaration, in agent id order, with
// its presence.
func (k *Kernel) Declarations() ([]Declaration, error) {
	var out []Declaration
	err := store.EachRecord(context.Background(), k.store, kindAgentInfo, "", func(_ string, d *Declaration) bool {
		out = append(out, *d)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("kernel: declarations: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := range out {
		if as := k.agents[out[i].AgentID]; as != nil {
			for _, c := range as.consumers {
				out[i].Online = out[i].Online || c.online
			}
		}
	}
	return out, nil
}
