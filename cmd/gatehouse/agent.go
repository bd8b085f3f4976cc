package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/gatehouse-dev/gatehouse/client"
)

// agentInfo is what `gatehouse agent` declares: an AAP AgentInfo whose
// server tool is the runner's gatehouse.echo.
func agentInfo(name string) map[string]any {
	return map[string]any{
		"name": name, "title": "Gatehouse example agent", "version": "1.0.0",
		"description": "Answers in words, calls gatehouse.echo on a runner when asked to echo, and a client tool when asked to use one.",
		"tools": []map[string]any{{
			"name": "gatehouse.echo", "description": "Echo the arguments (served by `gatehouse runner`).",
			"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"text": map[string]any{"type": "string"}}},
		}},
		"options": []map[string]any{
			{"type": "text", "name": "greeting", "title": "Greeting", "default": "Hello"},
			{"type": "secret", "name": "api_key", "title": "API key", "default": ""},
			{"type": "select", "name": "style", "options": []string{"plain", "loud"}, "default": "plain"},
		},
		"capabilities": map[string]any{
			"history":     map[string]any{"compacted": map[string]any{}, "full": map[string]any{}},
			"stream":      map[string]any{"delta": map[string]any{}, "message": map[string]any{}, "none": map[string]any{}},
			"application": map[string]any{"tools": map[string]any{}},
		},
	}
}

// agentCmd runs the example AAP agent: an ordinary agent process on its
// outbound stream that declared its AgentInfo. Asked in plain words it
// thinks aloud and answers word by word; asked to "echo" something it
// calls gatehouse.echo on a runner (which a person may have to allow); asked
// to "use <tool>" it calls that tool of the client's.
func agentCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("agent", stderr)
	var pf peerFlags
	var name string
	pf.add(fs, "bearer token (an agent JWT scoped to --name, or the static token)", "this process's connection id (default: the name and the host name)")
	fs.StringVar(&name, "name", "example", "agent id, and the AAP agent name")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if pf.consumerID == "" {
		host, _ := os.Hostname()
		pf.consumerID = name + "-" + hostConsumerID(host)
	}
	log, err := pf.logger(stderr)
	if err != nil {
		return err
	}
	c, err := pf.client("agent", client.Options{Logger: log})
	if err != nil {
		return err
	}
	if err := c.DeclareAgent(ctx, agentInfo(name)); err != nil {
		return cliError("agent: declare", pf.url.String(), err)
	}
	fmt.Fprintf(stdout, "agent %s (consumer %s) declared and serving on %s\n", name, pf.consumerID, pf.url.String())
	log.Info("agent started", slog.String("agent_id", name), slog.String("consumer_id", pf.consumerID))
	err = c.RunAgent(ctx, &client.Agent{AgentID: name, ConsumerID: pf.consumerID, Handle: func(ctx context.Context, t *client.Task) (any, error) {
		return exampleTurn(ctx, c, name, t)
	}})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return cliError("agent", pf.url.String(), err)
}

// exampleTurn runs one AAP turn of the example agent.
func exampleTurn(ctx context.Context, c *client.Client, name string, t *client.Task) (any, error) {
	var in struct {
		AAP struct {
			SessionID string `json:"sessionId"`
		} `json:"aap"`
	}
	if err := json.Unmarshal(t.Input(), &in); err != nil || in.AAP.SessionID == "" {
		return nil, errors.New("the example agent answers AAP sessions only")
	}
	sc, err := c.AAPContext(ctx, name, in.AAP.SessionID)
	if err != nil {
		return nil, err
	}
	text := lastUserText(sc.Messages)
	say := func(kind, s string) error { return t.Say(ctx, kind, s) }
	reply := func(answer string) (any, error) {
		if sc.Options["style"] == "loud" {
			answer = strings.ToUpper(answer)
		}
		words := strings.SplitAfter(answer, " ")
		for _, w := range words {
			if err := say(client.OutputTextDelta, w); err != nil {
				return nil, err
			}
		}
		if err := say(client.OutputText, answer); err != nil {
			return nil, err
		}
		return map[string]string{"text": answer}, nil
	}
	if err := say(client.OutputReasoning, "The user said: "+text); err != nil {
		return nil, err
	}
	lower := strings.ToLower(text)
	switch {
	case strings.HasPrefix(lower, "use "):
		tool := strings.TrimSpace(text[4:])
		step, err := t.Call(ctx, tool, map[string]string{"text": text})
		if err != nil {
			return nil, err
		}
		if _, err := t.Wait(ctx, client.SignalClientTools); err != nil {
			return nil, err
		}
		out, err := t.Result(ctx, tool, step)
		if err != nil {
			return reply("Your tool failed: " + err.Error())
		}
		var s string
		if json.Unmarshal(out, &s) != nil {
			s = string(out)
		}
		return reply("Your tool said: " + s)
	case strings.HasPrefix(lower, "echo "):
		out, err := t.Invoke(ctx, "gatehouse.echo", map[string]string{"text": text[5:]}, true)
		var pe *client.PolicyError
		if errors.As(err, &pe) {
			return reply("I may not echo: " + pe.Reason)
		}
		if err != nil {
			return nil, err
		}
		var echoed struct{ Text string }
		_ = json.Unmarshal(out, &echoed)
		return reply("The runner echoed: " + echoed.Text)
	}
	greeting := sc.Options["greeting"]
	if greeting == "" {
		greeting = "Hello"
	}
	return reply(greeting + ", you said: " + text)
}

// lastUserText is the text of the last user message of a history.
func lastUserText(msgs []json.RawMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(msgs[i], &m) != nil || m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var blocks []struct {
			Type, Text string
		}
		_ = json.Unmarshal(m.Content, &blocks)
		var b strings.Builder
		for _, bl := range blocks {
			if bl.Type == "text" {
				b.WriteString(bl.Text)
			}
		}
		return b.String()
	}
	return ""
}
