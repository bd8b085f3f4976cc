package auth

import (
	"errors"
	"fmt"
	"slices"
)

// ErrHidden reports a resource that exists, or may exist, but is not the
// caller's: another owner's execution or prompt, another tenant's, another
// agent's execution. Callers answer it exactly as they answer a resource
// that does not exist (404), so that a refusal never confirms that someone
// else's id is real.
var ErrHidden = errors.New("not visible to the caller")

// Owner is who a resource belongs to: the principal whose request created it
// and that principal's tenant. It is stored with the resource when it is
// created and compared, field by field, on every access.
type Owner struct {
	// Principal is the creator's subject ("local" in open mode, "static"
	// for the static token, the JWT sub otherwise).
	Principal string
	// Tenant is the creator's tenant claim; empty for a principal without
	// one.
	Tenant string
}

// Owner returns the owner that resources p creates get.
func (p *Principal) Owner() Owner { return Owner{Principal: p.Subject, Tenant: p.Tenant} }

// Kind names a kind of resource for [Principal.Authorize].
type Kind string

// The kinds of resources. Durable sessions and memory notes, when they come,
// are owned resources like executions and get a kind here.
const (
	// KindExecution is an execution with everything under it: its steps,
	// events, streams and signals. It has an owner.
	KindExecution Kind = "execution"
	// KindAction is a permission prompt (a bridge record). It has the owner
	// of its execution.
	KindAction Kind = "action"
	// KindChannel is a person's human channels: their registrations,
	// webhook, outboxes and channel log. Its owner is that person.
	KindChannel Kind = "channel"
	// KindAgent is an agent id: its streams, outbox and presence.
	KindAgent Kind = "agent"
	// KindRunner is a runner id: its streams, jobs, outbox, presence and
	// capabilities.
	KindRunner Kind = "runner"
	// KindPeer is the list of connected consumers (GET /v0/peers); each
	// row is checked as the agent, runner or channel it is.
	KindPeer Kind = "peer"
	// KindMetrics is the gateway's metrics: counts over every owner.
	KindMetrics Kind = "metrics"
	// KindSession is a durable session with everything in it: its log,
	// threads, turns and read models. It has an owner; its executions are
	// executions of that owner.
	KindSession Kind = "session"
)

// Action is what a caller wants to do with a resource.
type Action string

// The actions.
const (
	// ActRead reads: get, list, events, streams, presence.
	ActRead Action = "read"
	// ActWrite changes: create, cancel, signal; register or remove a
	// channel, acknowledge its deliveries.
	ActWrite Action = "write"
	// ActDecide answers a permission prompt.
	ActDecide Action = "decide"
	// ActAct speaks as the resource's agent or runner: an agent's intents
	// and step results for an execution; an agent's or runner's streams,
	// acknowledgements, results, capabilities and removal.
	ActAct Action = "act"
)

// Resource describes what a request touches, for [Principal.Authorize]. Only
// the fields of its kind matter.
type Resource struct {
	Kind Kind
	// ID names the resource in messages.
	ID string
	// Owner is who the resource belongs to. Agent and runner ids have
	// none: they are names the deployment gives its processes.
	Owner Owner
	// AgentID is the agent of an execution, or the id of a KindAgent.
	AgentID string
	// RunnerID is the id of a KindRunner.
	RunnerID string
}

// Unconfined reports whether p passes every check whatever the resource: an
// admin without a tenant. Callers use it only to skip looking a resource up;
// the rule itself is Authorize.
func (p *Principal) Unconfined() bool {
	return p != nil && p.Role == RoleAdmin && p.Tenant == ""
}

// roleActs says, per kind, which roles may ever perform each action, whatever
// the resource. It is the first half of the rule; Authorize adds the owner
// half. Admins are not listed: they may do everything.
var roleActs = map[Kind]map[Action][]Role{
	KindExecution: {ActRead: {RoleClient}, ActWrite: {RoleClient}, ActAct: {RoleAgent}},
	KindAction:    {ActRead: {RoleClient, RoleChannel}, ActDecide: {RoleClient, RoleChannel}},
	KindChannel:   {ActRead: {RoleClient, RoleChannel}, ActWrite: {RoleClient, RoleChannel}},
	KindAgent:     {ActRead: {RoleAgent}, ActAct: {RoleAgent}},
	KindRunner:    {ActRead: {RoleRunner}, ActAct: {RoleRunner}},
	KindPeer:      {ActRead: {RoleAgent, RoleRunner}},
	KindMetrics:   {ActRead: {RoleClient}},
	KindSession:   {ActRead: {RoleClient, RoleChannel}, ActWrite: {RoleClient}},
}

// Can reports whether p's role may ever perform act on resources of kind k.
// A refusal is [ErrForbidden]: it depends on the credential alone, so it
// reveals nothing about any resource. Lists call it once and then filter
// their rows with Authorize.
func (p *Principal) Can(act Action, k Kind) error {
	if p == nil {
		return fmt.Errorf("%w: no principal", ErrForbidden)
	}
	if p.Role == RoleAdmin || slices.Contains(roleActs[k][act], p.Role) {
		return nil
	}
	return fmt.Errorf("%w: %s %q may not %s", ErrForbidden, p.Role, p.Subject, describe(act, k))
}

// describe says what act on k is, for refusals.
func describe(act Action, k Kind) string {
	verb := map[Action]string{ActRead: "read", ActWrite: "change", ActDecide: "answer", ActAct: "act for"}[act]
	noun := map[Kind]string{
		KindExecution: "executions", KindAction: "permission prompts", KindChannel: "human channels",
		KindAgent: "agent ids", KindRunner: "runner ids", KindPeer: "peers", KindMetrics: "metrics",
		KindSession: "sessions",
	}[k]
	if verb == "" || noun == "" {
		return fmt.Sprintf("%s %s", act, k)
	}
	return verb + " " + noun
}

// Authorize is the access rule of the gateway: it decides whether p may
// perform act on r. Every door (HTTP routes, SSE and WebSocket streams,
// WebSocket command frames, the answers of chat bots and of the approvals
// page) asks it, and nothing else decides.
//
// The rule:
//   - A role that may never perform act on the kind is refused with
//     ErrForbidden (see Can).
//   - A principal with a tenant touches only owned resources of its tenant.
//   - An admin may do everything else.
//   - A client reads and writes the executions it owns; a client or channel
//     reads and answers the prompts it owns and uses its own channels.
//   - An agent acts for the executions of the agent ids its credential
//     lists, whoever owns them, and uses those agent ids; a runner uses the
//     runner ids its credential lists.
//
// A refusal that depends on the resource is ErrHidden, to be answered as
// "not found". The exception is an agent or runner id outside the
// credential's list: those ids are names, not owned data, and the refusal
// stays ErrForbidden, as the kernel API's scoped tokens always answered.
func (p *Principal) Authorize(act Action, r Resource) error {
	if err := p.Can(act, r.Kind); err != nil {
		return err
	}
	owned := r.Kind == KindExecution || r.Kind == KindAction || r.Kind == KindChannel || r.Kind == KindSession
	if owned && p.Tenant != "" && r.Owner.Tenant != p.Tenant {
		return p.hidden(r)
	}
	if p.Role == RoleAdmin {
		return nil
	}
	switch r.Kind {
	case KindExecution:
		if act == ActAct {
			return p.listed(p.Agents, r.AgentID, r, ErrHidden)
		}
		return p.owns(r)
	case KindAction, KindChannel, KindSession:
		return p.owns(r)
	case KindAgent:
		return p.listed(p.Agents, r.AgentID, r, ErrForbidden)
	case KindRunner:
		return p.listed(p.Runners, r.RunnerID, r, ErrForbidden)
	case KindPeer, KindMetrics:
		// Role-wide: the roles allowed by Can see all of it (peer rows are
		// checked one by one as agents, runners and channels).
		return nil
	}
	return fmt.Errorf("%w: unknown resource kind %q", ErrForbidden, r.Kind)
}

// owns passes when r belongs to p.
func (p *Principal) owns(r Resource) error {
	if r.Owner == p.Owner() {
		return nil
	}
	return p.hidden(r)
}

// listed passes when id is one of granted. An empty id never matches, so a
// missing parameter cannot be mistaken for a grant.
func (p *Principal) listed(granted []string, id string, r Resource, refusal error) error {
	if id != "" && slices.Contains(granted, id) {
		return nil
	}
	if refusal == ErrForbidden {
		return fmt.Errorf("%w: %s %q may not use %s %q", ErrForbidden, p.Role, p.Subject, r.Kind, id)
	}
	return p.hidden(r)
}

func (p *Principal) hidden(r Resource) error {
	return fmt.Errorf("%w: %s %s", ErrHidden, r.Kind, r.ID)
}
