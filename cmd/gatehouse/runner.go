package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
)

// builtinTools are the tools `gatehouse runner` can serve: small, safe
// examples of what a runner behind NAT does (no file or network access).
func builtinTools() map[string]client.ToolFunc {
	return map[string]client.ToolFunc{
		"gatehouse.echo": func(_ context.Context, args json.RawMessage) (any, error) {
			return args, nil
		},
		"gatehouse.time": func(context.Context, json.RawMessage) (any, error) {
			return map[string]string{"now": time.Now().UTC().Format(time.RFC3339Nano)}, nil
		},
		"gatehouse.sha256": func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct {
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(args, &in); err != nil || in.Text == nil {
				return nil, errors.New(`want arguments {"text": string}`)
			}
			sum := sha256.Sum256([]byte(*in.Text))
			return map[string]string{"sha256": hex.EncodeToString(sum[:])}, nil
		},
		"gatehouse.sleep": func(ctx context.Context, args json.RawMessage) (any, error) {
			var in struct {
				MS int `json:"ms"`
			}
			if err := json.Unmarshal(args, &in); err != nil || in.MS < 0 || in.MS > 600000 {
				return nil, errors.New(`want arguments {"ms": 0..600000}`)
			}
			select {
			case <-time.After(time.Duration(in.MS) * time.Millisecond):
				return map[string]int{"slept_ms": in.MS}, nil
			case <-ctx.Done():
				return nil, client.Retryable(ctx.Err())
			}
		},
	}
}

// builtinInfo describes the built-in tools as Runtime API capabilities.
func builtinInfo() map[string]client.ToolInfo {
	obj := func(props, required string) json.RawMessage {
		return json.RawMessage(`{"type":"object","properties":{` + props + `},"required":[` + required + `]}`)
	}
	return map[string]client.ToolInfo{
		"gatehouse.echo": {Description: "Returns its input unchanged.", Parameters: json.RawMessage(`{"type":"object"}`),
			IsReadOnly: true, SupportsIdempotency: true},
		"gatehouse.time": {Description: "Returns the runner's current time (RFC 3339, UTC).", Parameters: obj("", ""),
			IsReadOnly: true},
		"gatehouse.sha256": {Description: "Returns the SHA-256 of a text, in hex.", Parameters: obj(`"text":{"type":"string"}`, `"text"`),
			IsReadOnly: true, SupportsIdempotency: true},
		"gatehouse.sleep": {Description: "Waits the given milliseconds, then returns.", Parameters: obj(`"ms":{"type":"integer","minimum":0,"maximum":600000}`, `"ms"`),
			IsReadOnly: true, SupportsIdempotency: true},
	}
}

// runnerCmd runs a runner: it dials out to the gateway (no inbound port),
// holds one stream, runs the jobs it is given one at a time, and reconnects
// with backoff whenever the connection drops.
func runnerCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("runner", stderr)
	host, _ := os.Hostname()
	var pf peerFlags
	var runnerID, tools, accounts string
	pf.add(fs, "bearer token (a runner JWT scoped to --runner-id, or the static token)", "this process's connection id, kept across reconnects and restarts so the gateway hands it back its job; give each process of one --runner-id on one host its own (default: the host name)")
	fs.StringVar(&runnerID, "runner-id", "runner-"+host, "runner id")
	fs.StringVar(&tools, "tools", "", "comma-separated built-in tools to serve (default: all)")
	fs.StringVar(&accounts, "accounts", "", "comma-separated connected account ids to serve every tool on as well (the Runtime API's connectedAccountId)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if pf.consumerID == "" {
		pf.consumerID = hostConsumerID(host)
	}
	log, err := pf.logger(stderr)
	if err != nil {
		return err
	}
	all := builtinTools()
	served := map[string]client.ToolFunc{}
	if tools == "" {
		served = all
	}
	for _, name := range splitList(tools) {
		f, ok := all[name]
		if !ok {
			return fmt.Errorf("runner: unknown tool %q; built-in: %s", name, strings.Join(slices.Sorted(maps.Keys(all)), ", "))
		}
		served[name] = f
	}
	c, err := pf.client("runner", client.Options{Logger: log})
	if err != nil {
		return err
	}
	var info []client.ToolInfo
	for _, name := range slices.Sorted(maps.Keys(served)) {
		ti := builtinInfo()[name]
		ti.Name = name
		for _, acc := range splitList(accounts) {
			served[name+"@"+acc] = served[name]
			ti.Accounts = append(ti.Accounts, client.Account{ConnectedAccountID: acc, IntegrationID: "gatehouse", Backend: "builtin"})
		}
		info = append(info, ti)
	}
	names := slices.Sorted(maps.Keys(served))
	fmt.Fprintf(stdout, "runner %s (consumer %s) serving %s from %s\n", runnerID, pf.consumerID, strings.Join(names, ", "), pf.url.String())
	log.Info("runner started", slog.String("runner_id", runnerID), slog.String("consumer_id", pf.consumerID), slog.Any("tools", names))
	err = c.RunRunner(ctx, &client.Runner{RunnerID: runnerID, ConsumerID: pf.consumerID, Tools: served, Info: info})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return cliError("runner", pf.url.String(), err)
}

// hostConsumerID is the default consumer id: the host name, folded to
// lower-case letters, digits, '.' and '-'. It is the same after a restart,
// so a runner that comes back within the grace period gets back the job it
// held (a random id would leave that job to time out), and its old consumer
// is not left behind for the gateway to collect.
func hostConsumerID(host string) string {
	id := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, host)
	if id = strings.Trim(id, ".-"); id == "" || len(id) > 128 {
		return "runner"
	}
	return id
}
