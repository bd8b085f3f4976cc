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
	// Runners (extension) are the ids of the runners connected now that
	// serve the capability, on any account: the built-in memory runner for
	// the memory tools, and every runner the deployment trusts with an
	// integration and that declared it.
	Runners []string `json:"runners"`
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
// "<tool>@<account>" variants the runners serve, and the runners that
// serve it, on any account. A runner's description fills in the metadata;
// an undescribed tool takes any object.
func (s *Surface) capabilities() []Capability {
	type gathered struct {
		info     *toolInfo
		accounts map[string]bool
		runners  map[string]bool
	}
	tools := map[string]*gathered{}
	for _, st := range s.o.Kernel.Tools() {
		name, account, _ := strings.Cut(st.ID, "@")
		g := tools[name]
		if g == nil {
			g = &gathered{accounts: map[string]bool{}, runners: map[string]bool{}}
			tools[name] = g
		}
		for _, r := range st.Runners {
			g.runners[r] = true
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
	out := make([]Capability, 0, len(s.memory)+len(tools))
	for _, t := range s.memory {
		// The kernel serves these names to the built-in runner alone (see
		// Start): whoever else declared one is not listed, as it is given
		// none of their jobs.
		runners := []string{}
		if g := tools[t.Name]; g != nil {
			runners = sortedSet(g.runners)
		}
		out = append(out, Capability{Name: t.Name, Kind: kindMemory, Description: t.Description,
			Parameters: t.Parameters, IsReadOnly: t.ReadOnly, Runners: runners})
	}
	for name, g := range tools {
		if s.memory[name].Name != "" {
			continue
		}
		c := Capability{Name: name, Kind: kindIntegration, Parameters: openSchema, Runners: sortedSet(g.runners)}
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

// sortedSet returns the keys of m in order; never nil, so that a list
// encodes as [] when empty.
func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
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
