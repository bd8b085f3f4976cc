package runtimeapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/event"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel"
	"github.com/gatehouse-dev/gatehouse/memory"
	"github.com/gatehouse-dev/gatehouse/protocol"
	"github.com/gatehouse-dev/gatehouse/session"
)

// invocation is the body of POST /tools/{name} and
// POST /sessions/{id}/tools/{name}.
type invocation struct {
	Input              json.RawMessage `json:"input"`
	ConnectedAccountID string          `json:"connectedAccountId"`
	SessionID          string          `json:"sessionId"`
	Wait               bool            `json:"wait"`
}

// Invoked is the answer to an invocation: the handle to its execution,
// and its outcome when "wait" saw it end.
type Invoked struct {
	ExecutionID string          `json:"executionId"`
	SessionID   string          `json:"sessionId"`
	RunID       string          `json:"runId"`
	Status      string          `json:"status"`
	Output      json.RawMessage `json:"output,omitempty"`
	Error       string          `json:"error,omitempty"`
	Summary     string          `json:"summary,omitempty"`
}

func (s *Surface) invokeTool(r *protocol.Request) error { return s.invoke(r, "", r.Params[0]) }

func (s *Surface) invokeSessionTool(r *protocol.Request) error {
	return s.invoke(r, r.Params[0], r.Params[1])
}

// invoke runs one invocation as a direct execution filed in a session:
// the given one, or a new one.
func (s *Surface) invoke(r *protocol.Request, sessionID, name string) error {
	if err := r.Principal.Can(auth.ActWrite, auth.KindExecution); err != nil {
		return err
	}
	var in invocation
	if err := decode(r.Ctx, &in); err != nil {
		return err
	}
	if sessionID == "" {
		sessionID = in.SessionID
	}
	c, ok := s.capability(name)
	if !ok {
		return notFound("tool", name)
	}
	account, err := pickAccount(&c, in.ConnectedAccountID)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(in.Input)) == 0 || bytes.Equal(bytes.TrimSpace(in.Input), []byte("null")) {
		in.Input = json.RawMessage("{}")
	}
	if err := s.schemas.validate(c.Parameters, in.Input); err != nil {
		return err
	}
	if c.Kind == kindMemory {
		if err := s.o.Memory.Check(r.Ctx, memory.Owner{Tenant: r.Principal.Tenant, Principal: r.Principal.Subject}, name, in.Input); err != nil {
			return memoryRefusal(err)
		}
	}
	key := string(r.Ctx.Request.Header.Peek("Idempotency-Key"))
	sess, err := s.invocationSession(r.Ctx, r.Principal, sessionID, key)
	if err != nil {
		return err
	}
	if sess.Status == session.StatusArchived {
		return &apiError{fasthttp.StatusConflict, codeArchived, "session " + sess.ID + " is archived and takes no invocations", nil}
	}
	m := meta(r.Principal)
	m.IdempotencyKey = key
	v, _, err := s.o.Kernel.Create(r.Ctx, kernel.CreateRequest{
		SessionID: sess.ID,
		// With an account, the job goes only to a runner serving the tool
		// on it.
		Tool: &kernel.ToolCall{ToolID: name, Arguments: in.Input, Account: account},
	}, m)
	if err != nil {
		return err
	}
	out := Invoked{ExecutionID: v.ID, SessionID: sess.ID, RunID: runID(v.ID), Status: runStatus(v.Status)}
	status := fasthttp.StatusAccepted
	if in.Wait || v.Status.Terminal() {
		if v, err = s.await(r.Ctx, v); err == nil && v.Status.Terminal() {
			status = fasthttp.StatusOK
			out = s.outcome(&v)
		}
	}
	writeJSON(r.Ctx, status, out)
	return nil
}

// memoryRefusal is the answer to a memory call its check refused: 400 for
// input that is not allowed, 413 for a note too large, 507 for a quota,
// with the quota in details (scope, resource, max); another error (the
// store's) is answered as such.
func memoryRefusal(err error) error {
	var qe *memory.QuotaError
	switch {
	case errors.As(err, &qe):
		return &apiError{fasthttp.StatusInsufficientStorage, codeQuota, err.Error(),
			map[string]any{"scope": qe.Scope, "resource": qe.Resource, "max": qe.Max}}
	case errors.Is(err, memory.ErrTooLarge):
		return &apiError{fasthttp.StatusRequestEntityTooLarge, codeTooLarge, err.Error(), nil}
	case errors.Is(err, memory.ErrInvalid) || errors.Is(err, memory.ErrInvalidPath):
		return &apiError{fasthttp.StatusBadRequest, codeInvalidInput, err.Error(), nil}
	}
	return err
}

// invocationSession returns the session an invocation is filed in: the
// one named, or a new one. A new session made for a request with an
// Idempotency-Key is named after the key, so that the retry files the
// same request in the same session and the kernel answers it with the
// first execution.
func (s *Surface) invocationSession(ctx context.Context, p *auth.Principal, named, key string) (session.Session, error) {
	if named != "" {
		return s.session(ctx, p, auth.ActWrite, named)
	}
	if key == "" {
		return s.newSession(ctx, p, "", "")
	}
	sum := sha256.Sum256([]byte(p.Tenant + "\x00" + p.Subject + "\x00" + key))
	id := "idem-" + hex.EncodeToString(sum[:16])
	if sess, err := s.session(ctx, p, auth.ActWrite, id); err == nil {
		return sess, nil
	}
	sess, err := s.newSession(ctx, p, id, "")
	if errors.Is(err, session.ErrExists) || errors.Is(err, auth.ErrHidden) {
		return s.session(ctx, p, auth.ActWrite, id) // a concurrent retry made it
	}
	return sess, err
}

// pickAccount decides the connected account of an invocation: the one
// named, which the capability must list; the only one; or none for a
// capability on no account. Naming none of several is 409 with the list.
func pickAccount(c *Capability, named string) (string, error) {
	if named != "" {
		for _, a := range c.Accounts {
			if a.ConnectedAccountID == named {
				return named, nil
			}
		}
		return "", &apiError{fasthttp.StatusBadRequest, codeUnknownAccount,
			fmt.Sprintf("tool %s is not connected on account %q", c.Name, named), map[string]any{"accounts": accountsOf(c)}}
	}
	switch len(c.Accounts) {
	case 0:
		return "", nil
	case 1:
		return c.Accounts[0].ConnectedAccountID, nil
	}
	return "", &apiError{fasthttp.StatusConflict, codeAccountRequired,
		fmt.Sprintf("tool %s is connected on %d accounts: name one in connectedAccountId", c.Name, len(c.Accounts)),
		map[string]any{"accounts": accountsOf(c)}}
}

func accountsOf(c *Capability) []Account {
	if c.Accounts == nil {
		return []Account{}
	}
	return c.Accounts
}

// await holds until execution v ends or the wait limit passes, and returns
// it as it is then.
func (s *Surface) await(ctx context.Context, v kernel.View) (kernel.View, error) {
	w := s.o.Kernel.Watch(v.ID)
	defer w.Stop()
	limit := time.NewTimer(s.o.WaitLimit)
	defer limit.Stop()
	for {
		cur, err := s.o.Kernel.Get(ctx, v.ID)
		if err != nil || cur.Status.Terminal() {
			return cur, err
		}
		select {
		case <-w.C():
		case <-w.Done():
			return cur, nil
		case <-limit.C:
			return cur, nil
		case <-ctx.Done():
			return cur, ctx.Err()
		}
	}
}

// outcome is a finished execution as an invocation's answer.
func (s *Surface) outcome(v *kernel.View) Invoked {
	out := Invoked{ExecutionID: v.ID, SessionID: v.SessionID, RunID: runID(v.ID), Status: runStatus(v.Status)}
	if v.Status == kernel.StatusCompleted {
		out.Output = v.Output
		out.Summary = summarize(v.Tool, v.Output)
		return out
	}
	out.Error = s.failure(v.ID)
	return out
}

// failure is why an execution failed, from its terminal event.
func (s *Surface) failure(id string) string {
	msg := "execution failed"
	_ = s.o.Kernel.ReadEventValues(id, 0, func(e *event.Event) bool {
		if e.Type == event.ExecutionFailed || e.Type == event.ExecutionCancelled {
			var p struct {
				Error  string `json:"error"`
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(e.Payload, &p)
			switch {
			case p.Error != "":
				msg = p.Error
			case e.Type == event.ExecutionCancelled:
				msg = "execution cancelled"
			}
		}
		return true
	})
	return msg
}

// getExecution answers GET /executions/{id} (extension).
func (s *Surface) getExecution(r *protocol.Request) error {
	v, err := s.execution(r.Ctx, r.Principal, r.Params[0])
	if err != nil {
		return err
	}
	out := map[string]any{
		"executionId": v.ID, "sessionId": v.SessionID, "runId": runID(v.ID), "tool": v.Tool.ToolID,
		"input": json.RawMessage(orEmpty(v.Tool.Arguments)), "status": runStatus(v.Status), "createdAt": v.CreatedAt,
	}
	if v.Tool.Account != "" {
		out["connectedAccountId"] = v.Tool.Account
	}
	if v.Status.Terminal() {
		o := s.outcome(&v)
		out["completedAt"] = v.UpdatedAt
		if o.Output != nil {
			out["output"] = o.Output
		}
		if o.Error != "" {
			out["error"] = o.Error
		}
		if o.Summary != "" {
			out["summary"] = o.Summary
		}
	}
	writeJSON(r.Ctx, fasthttp.StatusOK, out)
	return nil
}

// execution returns direct execution id if p may read it: another's, and
// an execution that is not an invocation, are not found.
func (s *Surface) execution(ctx context.Context, p *auth.Principal, id string) (kernel.View, error) {
	if err := p.Can(auth.ActRead, auth.KindExecution); err != nil {
		return kernel.View{}, err
	}
	v, err := s.o.Kernel.Get(ctx, id)
	if err != nil || v.Tool == nil {
		return kernel.View{}, notFound("execution", id)
	}
	res := auth.Resource{Kind: auth.KindExecution, ID: v.ID, Owner: auth.Owner{Principal: v.Owner, Tenant: v.Tenant}}
	if p.Authorize(auth.ActRead, res) != nil {
		return kernel.View{}, notFound("execution", id)
	}
	return v, nil
}

func orEmpty(v json.RawMessage) json.RawMessage {
	if len(v) == 0 {
		return json.RawMessage("{}")
	}
	return v
}

// runID names an execution's run. A direct execution has one run; its id
// is derived so that every surface names it the same.
func runID(executionID string) string { return "run-" + executionID }

// runStatus is the seeds' run status of an execution status.
func runStatus(st kernel.Status) string {
	switch st {
	case kernel.StatusCompleted:
		return "completed"
	case kernel.StatusFailed, kernel.StatusCancelled:
		return "failed"
	case kernel.StatusBlocked:
		return "waiting"
	}
	return "executing"
}

// summarize says in a few words what a finished invocation gave: "N
// hits" for a search, as the seeds show, "N entries" for a listing, the
// note's path for a memory read or write, and "<tool> completed" for any
// other tool, whatever its output holds.
func summarize(tool *kernel.ToolCall, output json.RawMessage) string {
	if tool == nil {
		return "completed"
	}
	var o struct {
		Hits    []json.RawMessage `json:"hits"`
		Entries []json.RawMessage `json:"entries"`
		Path    string            `json:"path"`
	}
	_ = json.Unmarshal(output, &o)
	switch tool.ToolID {
	case "memory_search":
		return fmt.Sprintf("%d hits", len(o.Hits))
	case "memory_ls":
		return fmt.Sprintf("%d entries", len(o.Entries))
	case "memory_read", "memory_write", "memory_append", "save_memory_note":
		if o.Path != "" {
			return o.Path
		}
	}
	return tool.ToolID + " completed"
}

// errExternalRef refuses a reference out of a tool's parameters schema.
var errExternalRef = errors.New("a tool's parameters may reference only their own document")

// inDocumentOnly is the schema compiler's loader: it refuses every URL, so
// that "$ref" and "$schema" resolve within the schema the runner sent (and
// the standard's own meta-schemas, which the library carries), and nowhere
// else. The library's default loader reads file URLs: a runner's
// "$ref":"file:///..." read the gateway's files into a schema that then
// judged, and quoted, people's input, and a file that did not exist
// answered differently from one that did. Nothing is read, and compile
// answers every refused reference with errExternalRef alone, not the
// library's wording of it.
type inDocumentOnly struct{ refused bool }

func (l *inDocumentOnly) Load(string) (any, error) {
	l.refused = true
	return nil, errExternalRef
}

// schemaCache compiles capability parameter schemas once, by content.
type schemaCache struct {
	mu sync.Mutex
	m  map[[32]byte]*jsonschema.Schema
}

// maxSchemas bounds the compiled schemas kept; past it the cache starts
// over (runners rarely change their tools).
const maxSchemas = 1024

// validate checks input against schema; a failure is 400 with every error.
func (c *schemaCache) validate(schema, input json.RawMessage) error {
	sch, err := c.compile(schema)
	if err != nil {
		// A runner's broken schema must not make its tool uncallable: the
		// runner checks its own input.
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(input))
	if err != nil {
		return badRequest("input is not JSON: " + err.Error())
	}
	err = sch.Validate(inst)
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		var errs []string
		for _, u := range ve.BasicOutput().Errors {
			if u.Error != nil {
				errs = append(errs, fmt.Sprintf("%s: %s", orRoot(u.InstanceLocation), u.Error.String()))
			}
		}
		return &apiError{fasthttp.StatusBadRequest, codeInvalidInput, "input does not match the tool's parameters", map[string]any{"errors": errs}}
	}
	return err
}

func orRoot(loc string) string {
	if loc == "" {
		return "/"
	}
	return loc
}

func (c *schemaCache) compile(schema json.RawMessage) (*jsonschema.Schema, error) {
	key := sha256.Sum256(schema)
	c.mu.Lock()
	defer c.mu.Unlock()
	if sch := c.m[key]; sch != nil {
		return sch, nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, err
	}
	comp := jsonschema.NewCompiler()
	loader := &inDocumentOnly{}
	comp.UseLoader(loader)
	if err := comp.AddResource("tool.json", doc); err != nil {
		return nil, err
	}
	sch, err := comp.Compile("tool.json")
	if loader.refused {
		return nil, errExternalRef
	}
	if err != nil {
		return nil, err
	}
	if c.m == nil || len(c.m) >= maxSchemas {
		c.m = map[[32]byte]*jsonschema.Schema{}
	}
	c.m[key] = sch
	return sch, nil
}
