package gateway_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gatehouse-dev/gatehouse/gateway"
	"github.com/gatehouse-dev/gatehouse/gateway/auth"
	"github.com/gatehouse-dev/gatehouse/kernel/policy/policytest"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/stream/ssetest"
)

// matrixRow says who may use one route, against resources that belong to
// alice, a client: every caller outside ok and hidden is refused with 403
// (401 without a token, unless the route is public).
type matrixRow struct {
	// req sends the request as caller who and returns the answer.
	req func(who string, a *api) (int, string)
	// status is the answer of a caller in ok.
	status int
	// ok may use the route; hidden get the answer for a missing resource
	// (404, or a list without alice's resource).
	ok, hidden []string
	// list, for a list route, is the id that ok callers see and hidden
	// ones do not.
	list   string
	public bool
}

// TestAccessMatrix sends every route of the router as every kind of caller
// and checks the answer against the access rule. A route added without a
// row here fails the test: decide who may use it first.
func TestAccessMatrix(t *testing.T) {
	pol := policytest.Parse(t, bridgePolicy)
	s := start(t, node.Options{Policy: pol, Auth: jwtOptions()})
	claims := map[string]auth.Claims{
		"admin":         {Subject: "ops", Role: auth.RoleAdmin},
		"tenant-admin":  {Subject: "ops-acme", Role: auth.RoleAdmin, Tenant: "acme"},
		"alice":         {Subject: "alice", Role: auth.RoleClient},
		"bob":           {Subject: "bob", Role: auth.RoleClient},
		"alice-channel": {Subject: "alice", Role: auth.RoleChannel},
		"mallory":       {Subject: "mallory", Role: auth.RoleChannel},
		"agent":         {Subject: "bot", Role: auth.RoleAgent, Agents: []string{"m-agent"}},
		"other-agent":   {Subject: "bot2", Role: auth.RoleAgent, Agents: []string{"m-other"}},
		"runner":        {Subject: "r", Role: auth.RoleRunner, Runners: []string{"m-runner"}, Tools: []string{"work"}},
		"other-runner":  {Subject: "r2", Role: auth.RoleRunner, Runners: []string{"m-other-runner"}},
	}
	as := func(who string) *api {
		a := newAPI(t, s)
		if c, ok := claims[who]; ok {
			a.token = mint(t, c)
		}
		return a
	}
	callers := []string{"anonymous"}
	for who := range claims {
		callers = append(callers, who)
	}
	sort.Strings(callers)

	// Alice's resources: a finished execution whose agent ran a remote
	// step on m-runner, and a prompt she has answered.
	alice, agentAPI, runnerAPI := as("alice"), as("agent"), as("runner")
	ag := agentAPI.agent("m-agent", "fixture")
	run := runnerAPI.runner("m-runner", "fixture", "work")
	done, lease := alice.assigned(ag, obj{"x": 1})
	step := agentAPI.intent(done, lease, obj{"type": "invoke_tool", "tool_id": "work", "remote": true}, 200)["step_id"].(string)
	job := run.expect("job.assigned")
	result := obj{"job_id": job["id"], "execution_id": done, "step_id": step, "success": true, "data": "ok"}
	runnerAPI.json("POST", "/v0/runners/m-runner/results", result, 200)
	ag.expect("tool.result")
	agentAPI.intent(done, lease, obj{"type": "complete"}, 200)
	asked, lease2 := alice.assigned(ag, nil)
	agentAPI.intent(asked, lease2, obj{"type": "invoke_tool", "tool_id": "deploy.m"}, 200)
	pending := alice.json("GET", "/v0/actions?status=pending", nil, 200)["actions"].([]any)
	if len(pending) != 1 {
		t.Fatalf("alice's pending prompts: %v", pending)
	}
	action := pending[0].(obj)["action_id"].(string)
	alice.json("POST", "/v0/actions/"+action+"/respond", obj{"decision": "allow_once"}, 200)
	ag.expect("approval.resolved")

	do := func(method, path string, body any) func(string, *api) (int, string) {
		return func(_ string, a *api) (int, string) {
			status, data, _ := a.do(method, path, body)
			return status, string(data)
		}
	}
	sse := func(path string) func(string, *api) (int, string) {
		return func(who string, a *api) (int, string) {
			st, status, body := a.trySSE(strings.ReplaceAll(path, "WHO", who))
			if st != nil {
				st.close()
			}
			return status, body
		}
	}
	ws := func(path string) func(string, *api) (int, string) {
		return func(who string, a *api) (int, string) {
			c, resp, err := a.tryWS(strings.ReplaceAll(path, "WHO", who), gateway.SubprotocolJSON)
			if err == nil {
				_ = c.CloseNow()
				return http.StatusSwitchingProtocols, ""
			}
			if resp == nil {
				t.Fatalf("dial %s: %v", path, err)
			}
			return resp.StatusCode, respBody(resp)
		}
	}
	everyone := slices.DeleteFunc(slices.Clone(callers), func(c string) bool { return c == "anonymous" })
	owners, strangers := []string{"admin", "alice"}, []string{"bob", "tenant-admin"}
	agents, otherAgents := []string{"admin", "agent"}, []string{"other-agent", "tenant-admin"}
	agentIDs, runnerIDs := []string{"admin", "tenant-admin", "agent"}, []string{"admin", "tenant-admin", "runner"}
	clients := []string{"admin", "tenant-admin", "alice", "bob"}
	people := []string{"admin", "tenant-admin", "alice", "bob", "alice-channel", "mallory"}
	answerers, others := []string{"admin", "alice", "alice-channel"}, []string{"bob", "mallory", "tenant-admin"}
	workers := []string{"admin", "tenant-admin", "agent", "other-agent", "runner", "other-runner"}
	x := "/v0/executions/" + done
	alice.json("POST", "/agent-runtime/sessions", obj{"sessionId": "m-sess", "agentId": "m-agent"}, 201)
	readers, sessionStrangers := []string{"admin", "alice", "alice-channel"}, []string{"bob", "mallory", "tenant-admin"}
	ar := "/agent-runtime/sessions/m-sess"
	info := obj{"name": "m-agent", "version": "1.0.0"}
	agentAPI.json("PUT", "/aap/v1/agents/m-agent", info, 200)
	aapSession := openAAPSession(t, alice, "m-agent")
	aap := "/aap/v1/session/" + aapSession
	alice.json("POST", "/runtime/v1/sessions", obj{"id": "m-rt"}, 201)
	alice.json("POST", "/runtime/v1/sessions", obj{"id": "m-rt-archive"}, 201)
	direct := alice.json("POST", "/v0/executions", obj{"tool": obj{"tool_id": "m-unserved"}, "session_id": "m-rt"}, 201)["id"].(string)
	rt := "/runtime/v1"

	rows := map[string]matrixRow{
		"GET /v0/health": {req: do("GET", "/v0/health", nil), status: 200, ok: everyone, public: true},
		"GET /v0/ready":  {req: do("GET", "/v0/ready", nil), status: 200, ok: everyone, public: true},
		"GET /metrics":   {req: do("GET", "/metrics", nil), status: 200, ok: clients},

		"POST /v0/executions":               {req: do("POST", "/v0/executions", obj{"agent_id": "m-none"}), status: 201, ok: clients},
		"GET /v0/executions":                {req: do("GET", "/v0/executions?agent_id=m-agent", nil), status: 200, ok: owners, hidden: strangers, list: done},
		"GET /v0/executions/{}":             {req: do("GET", x, nil), status: 200, ok: owners, hidden: strangers},
		"POST /v0/executions/{}/cancel":     {req: do("POST", x+"/cancel", nil), status: 409, ok: owners, hidden: strangers},
		"POST /v0/executions/{}/signal":     {req: do("POST", x+"/signal", obj{"signal_type": "go"}), status: 409, ok: owners, hidden: strangers},
		"GET /v0/executions/{}/events":      {req: do("GET", x+"/events", nil), status: 200, ok: owners, hidden: strangers},
		"GET /v0/executions/{}/stream":      {req: sse(x + "/stream"), status: 200, ok: owners, hidden: strangers},
		"GET /v0/executions/{}/ws":          {req: ws(x + "/ws"), status: 101, ok: owners, hidden: strangers},
		"GET /v0/agents/stream":             {req: sse("/v0/agents/stream?agent_id=m-agent&consumer_id=WHO"), status: 200, ok: agentIDs},
		"GET /v0/agents/ws":                 {req: ws("/v0/agents/ws?agent_id=m-agent&consumer_id=WHO-ws"), status: 101, ok: agentIDs},
		"POST /v0/agents/intent":            {req: do("POST", "/v0/agents/intent", obj{"execution_id": done, "session_id": lease, "intent": obj{"type": "complete"}}), status: 409, ok: agents, hidden: otherAgents},
		"POST /v0/agents/step-result":       {req: do("POST", "/v0/agents/step-result", obj{"execution_id": done, "session_id": lease, "step_id": step, "success": true, "result": "ok"}), status: 409, ok: agents, hidden: otherAgents},
		"GET /v0/runners/stream":            {req: sse("/v0/runners/stream?runner_id=m-runner&consumer_id=WHO"), status: 200, ok: runnerIDs},
		"GET /v0/runners/ws":                {req: ws("/v0/runners/ws?runner_id=m-runner&consumer_id=WHO-ws"), status: 101, ok: runnerIDs},
		"POST /v0/runners/steps/{}/started": {req: do("POST", "/v0/runners/steps/"+step+"/started", obj{"execution_id": done, "runner_id": "m-runner"}), status: 200, ok: runnerIDs},
		"POST /v0/runners/{}/results":       {req: do("POST", "/v0/runners/m-runner/results", result), status: 200, ok: runnerIDs},
		"POST /v0/runners/{}/capabilities":  {req: do("POST", "/v0/runners/m-runner/capabilities", obj{"tools": []string{"work"}}), status: 200, ok: runnerIDs},
		"DELETE /v0/runners/{}":             {req: do("DELETE", "/v0/runners/m-runner", nil), status: 204, ok: runnerIDs},

		"GET /v0/peers":      {req: do("GET", "/v0/peers", nil), status: 200, ok: workers},
		"POST /v0/peers/ack": {req: do("POST", "/v0/peers/ack", obj{"role": "agent", "id": "m-agent", "consumer_id": "fixture", "sequence": 0}), status: 200, ok: agentIDs},

		"GET /v0/actions":             {req: do("GET", "/v0/actions", nil), status: 200, ok: answerers, hidden: others, list: action},
		"GET /v0/actions/{}":          {req: do("GET", "/v0/actions/"+action, nil), status: 200, ok: answerers, hidden: others},
		"POST /v0/actions/{}/respond": {req: do("POST", "/v0/actions/"+action+"/respond", obj{"decision": "deny"}), status: 409, ok: answerers, hidden: others},
		"GET /v0/channels/stream":     {req: sse("/v0/channels/stream?channel_id=matrix&peer_id=WHO"), status: 200, ok: people},
		"GET /v0/channels/ws":         {req: ws("/v0/channels/ws?channel_id=matrix-ws&peer_id=WHO"), status: 101, ok: people},
		"GET /v0/channels":            {req: do("GET", "/v0/channels", nil), status: 200, ok: people},
		"GET /v0/channels/events":     {req: do("GET", "/v0/channels/events", nil), status: 200, ok: people},
		"PUT /v0/channels/webhook":    {req: do("PUT", "/v0/channels/webhook", obj{"url": "not a url", "secret": "0123456789abcdef"}), status: 400, ok: people},
		"DELETE /v0/channels/webhook": {req: do("DELETE", "/v0/channels/webhook", nil), status: 404, ok: people},

		"GET /agent-runtime/sessions":               {req: do("GET", "/agent-runtime/sessions", nil), status: 200, ok: readers, hidden: sessionStrangers, list: "m-sess"},
		"POST /agent-runtime/sessions":              {req: do("POST", "/agent-runtime/sessions", obj{"agentId": "m-agent"}), status: 201, ok: clients},
		"GET /agent-runtime/sessions/{}":            {req: do("GET", ar, nil), status: 200, ok: readers, hidden: sessionStrangers},
		"GET /agent-runtime/sessions/{}/events":     {req: do("GET", ar+"/events", nil), status: 200, ok: readers, hidden: sessionStrangers},
		"GET /agent-runtime/sessions/{}/ws":         {req: ws(ar + "/ws"), status: 101, ok: readers, hidden: sessionStrangers},
		"GET /agent-runtime/sessions/{}/threads/{}": {req: do("GET", ar+"/threads/main", nil), status: 200, ok: readers, hidden: sessionStrangers},
		"POST /agent-runtime/commands/{}":           {req: do("POST", "/agent-runtime/commands/get_session", obj{"session_id": "m-sess"}), status: 200, ok: readers, hidden: sessionStrangers},
		"GET /aap/v1/meta":                          {req: do("GET", "/aap/v1/meta", nil), status: 200, ok: everyone},
		"GET /aap/v1/sessions":                      {req: do("GET", "/aap/v1/sessions", nil), status: 200, ok: readers, hidden: sessionStrangers, list: aapSession},
		"PUT /aap/v1/session":                       {req: do("PUT", "/aap/v1/session", obj{"agent": obj{"name": "m-agent"}}), status: 400, ok: clients},
		"POST /aap/v1/session/{}":                   {req: do("POST", aap, obj{"messages": []obj{{"role": "user", "content": "busy?"}}}), status: 409, ok: owners, hidden: strangers},
		"GET /aap/v1/session/{}":                    {req: do("GET", aap, nil), status: 200, ok: readers, hidden: sessionStrangers},
		"DELETE /aap/v1/session/{}":                 {req: do("DELETE", "/aap/v1/session/m-no-such-session", nil), status: 404, ok: clients},
		"GET /aap/v1/session/{}/stream":             {req: sse(aap + "/stream"), status: 200, ok: readers, hidden: sessionStrangers},
		"PUT /aap/v1/agents/{}":                     {req: do("PUT", "/aap/v1/agents/m-agent", info), status: 200, ok: agentIDs},
		"GET /aap/v1/agents/{}/sessions/{}":         {req: do("GET", "/aap/v1/agents/m-agent/sessions/"+aapSession, nil), status: 200, ok: agentIDs},
		"GET /runtime/v1/capabilities":              {req: do("GET", rt+"/capabilities", nil), status: 200, ok: people},
		"POST /runtime/v1/tools/{}":                 {req: do("POST", rt+"/tools/m-no-such-tool", obj{"input": obj{}}), status: 404, ok: clients},
		"POST /runtime/v1/sessions":                 {req: do("POST", rt+"/sessions", obj{}), status: 201, ok: clients},
		"GET /runtime/v1/sessions":                  {req: do("GET", rt+"/sessions", nil), status: 200, ok: readers, hidden: sessionStrangers, list: "m-rt"},
		"GET /runtime/v1/sessions/{}":               {req: do("GET", rt+"/sessions/m-rt", nil), status: 200, ok: readers, hidden: sessionStrangers},
		"GET /runtime/v1/sessions/{}/capabilities":  {req: do("GET", rt+"/sessions/m-rt/capabilities", nil), status: 200, ok: readers, hidden: sessionStrangers},
		"POST /runtime/v1/sessions/{}/tools/{}":     {req: do("POST", rt+"/sessions/m-rt/tools/m-no-such-tool", obj{}), status: 404, ok: owners, hidden: strangers},
		"POST /runtime/v1/sessions/{}/archive":      {req: do("POST", rt+"/sessions/m-rt-archive/archive", nil), status: 200, ok: owners, hidden: strangers},
		"GET /runtime/v1/executions/{}":             {req: do("GET", rt+"/executions/"+direct, nil), status: 200, ok: owners, hidden: strangers},
		"GET /runtime/v1/executions/{}/events":      {req: sse(rt + "/executions/" + direct + "/events"), status: 200, ok: owners, hidden: strangers},
		"GET /agent-runtime/exports/{}":             {req: do("GET", "/agent-runtime/exports/m-sess", nil), status: 200, ok: readers, hidden: sessionStrangers},
	}

	routes := gateway.RouteKeys(s.Node.Server)
	for key := range rows {
		if !slices.Contains(routes, key) {
			t.Errorf("matrix row %q matches no route", key)
		}
	}
	for _, key := range routes {
		row, ok := rows[key]
		if !ok {
			t.Errorf("route %s has no row in the access matrix: decide who may use it", key)
			continue
		}
		for _, who := range callers {
			status, body := row.req(who, as(who))
			want, code := 403, "FORBIDDEN"
			switch {
			case row.public || slices.Contains(row.ok, who):
				want, code = row.status, ""
			case who == "anonymous":
				want, code = 401, "UNAUTHORIZED"
			case slices.Contains(row.hidden, who) && row.list != "":
				want, code = 200, ""
			case slices.Contains(row.hidden, who):
				want, code = 404, "NOT_FOUND"
			}
			if status != want {
				t.Errorf("%s as %s: %d, want %d: %s", key, who, status, want, body)
				continue
			}
			if code != "" {
				// The Runtime API words its code in details.code.
				var e struct {
					Code    string
					Details struct{ Code string }
				}
				if json.Unmarshal([]byte(body), &e) != nil || e.Code+e.Details.Code != code {
					t.Errorf("%s as %s: body %s, want code %s", key, who, body, code)
				}
			}
			if row.list != "" && status == 200 {
				if seen := strings.Contains(body, row.list); seen != slices.Contains(row.ok, who) {
					t.Errorf("%s as %s: alice's %s listed: %v", key, who, row.list, seen)
				}
			}
		}
	}
	// The approvals page is files only: no data, no token.
	if status, _, _ := as("anonymous").do("GET", "/ui/", nil); status != 200 {
		t.Errorf("GET /ui/ without a token: %d", status)
	}
}

// openAAPSession opens an AAP session of a's with agent in stream mode and
// returns its id once the stream started; the turn stays running.
func openAAPSession(t *testing.T, a *api, agent string) string {
	t.Helper()
	body := `{"agent":{"name":"` + agent + `"},"stream":"delta","messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequestWithContext(t.Context(), "PUT", a.base+"/aap/v1/session", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := ssetest.NewReader(resp.Body)
	for {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("PUT /aap/v1/session: %d: %v", resp.StatusCode, err)
		}
		var start struct{ SessionID string }
		if json.Unmarshal([]byte(f.Data), &start) == nil && start.SessionID != "" {
			return start.SessionID
		}
	}
}
