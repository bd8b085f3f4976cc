package runtimeapi

import (
	"encoding/json"
	"sort"
	"strings"
)

// Capability kinds.
const (
	kindIntegration = "integration"
	kindMemory      = "memory"
)

// memoryRunner is the runner id of the built-in memory runner.
const memoryRunner = "gatehouse.memory"

// openSchema is the parameters of a tool its runner did not describe: any
// object.
var openSchema = json.RawMessage(`{"type":"object"}`)

// Capability is one invocable tool, as the seeds show it.
type Capability struct {
	Name                string          `json:"name"`
	Kind                string          `json:"kind"`
	Description         string          `json:"description"`
	Parameters          json.RawMessage `json:"parameters"`
	IsReadOnly          bool            `json:"isReadOnly"`
	SupportsIdempotency bool            `json:"supportsIdempotency"`
	Accounts            []Account       `json:"accounts,omitempty"`
}

// Account is a connected account an integration capability runs on.
type Account struct {
	ConnectedAccountID string `json:"connectedAccountId"`
	IntegrationID      string `json:"integrationId"`
	Backend            string `json:"backend"`
}

// toolInfo is what a runner says about one of its tools.
type toolInfo struct {
	Description         string          `json:"description"`
	Parameters          json.RawMessage `json:"parameters"`
	IsReadOnly          bool            `json:"isReadOnly"`
	SupportsIdempotency bool            `json:"supportsIdempotency"`
	Accounts            []Account       `json:"accounts"`
}

// capabilities returns every capability usable now: the memory tools and
// every tool an online runner serves, its accounts gathered from the
// "<tool>@<account>" variants the runners serve. A runner's description
// fills in the metadata; an undescribed tool takes any object.
func (s *Surface) capabilities() []Capability {
	out := make([]Capability, 0, len(s.memory))
	for _, t := range s.memory {
		out = append(out, Capability{Name: t.Name, Kind: kindMemory, Description: t.Description,
			Parameters: t.Parameters, IsReadOnly: t.ReadOnly})
	}
	type gathered struct {
		info     *toolInfo
		accounts map[string]bool
	}
	tools := map[string]*gathered{}
	for _, st := range s.o.Kernel.Tools() {
		if len(st.Runners) == 1 && st.Runners[0] == memoryRunner {
			continue
		}
		name, account, _ := strings.Cut(st.ID, "@")
		g := tools[name]
		if g == nil {
			g = &gathered{accounts: map[string]bool{}}
			tools[name] = g
		}
		if account != "" {
			g.accounts[account] = true
		}
		if g.info == nil && len(st.Info) > 0 {
			var ti toolInfo
			if json.Unmarshal(st.Info, &ti) == nil {
				g.info = &ti
			}
		}
	}
	for name, g := range tools {
		if s.memory[name].Name != "" {
			continue // the built-in memory's names are its own
		}
		c := Capability{Name: name, Kind: kindIntegration, Parameters: openSchema}
		described := map[string]Account{}
		if g.info != nil {
			c.Description, c.IsReadOnly, c.SupportsIdempotency = g.info.Description, g.info.IsReadOnly, g.info.SupportsIdempotency
			if len(g.info.Parameters) > 0 {
				c.Parameters = g.info.Parameters
			}
			for _, a := range g.info.Accounts {
				described[a.ConnectedAccountID] = a
			}
		}
		// Only accounts a connected runner serves are listed: an account
		// whose runner went away is not invocable.
		for acc := range g.accounts {
			a, ok := described[acc]
			if !ok {
				a = Account{ConnectedAccountID: acc}
			}
			c.Accounts = append(c.Accounts, a)
		}
		sort.Slice(c.Accounts, func(i, j int) bool { return c.Accounts[i].ConnectedAccountID < c.Accounts[j].ConnectedAccountID })
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// capability returns the capability named name, if it is usable now.
func (s *Surface) capability(name string) (Capability, bool) {
	for _, c := range s.capabilities() {
		if c.Name == name {
			return c, true
		}
	}
	return Capability{}, false
}
