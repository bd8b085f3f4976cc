package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/gatehouse-dev/gatehouse/client"
)

const approveUsage = `Usage:
  gatehouse approve [--url U] [--token T]
      list the pending permission prompts
  gatehouse approve [--url U] [--token T] <action-id> allow_once|allow_always|deny [--reason R]
      answer one prompt

Flags:
`

// approveCmd lists pending permission prompts or answers one, over the
// gateway's /v0/actions API. An answer that comes too late prints the
// outcome that was recorded and fails, so scripts notice.
func approveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("approve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, approveUsage)
		fs.PrintDefaults()
	}
	var gf gatewayFlags
	var reason string
	var timeout time.Duration
	gf.add(fs, "bearer token: the static token, or a channel or client JWT (empty: open gateway)")
	fs.StringVar(&reason, "reason", "", "reason recorded with the answer")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "limit for each request")
	// flag stops at the first positional argument; flags may also follow
	// the action id and decision, so parsing resumes after each one.
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	c, err := gf.client("approve", client.Options{RequestTimeout: timeout})
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	switch len(pos) {
	case 0:
		if reason != "" {
			return errors.New("approve: --reason applies only when answering a prompt")
		}
		return cliError("approve", gf.url.String(), listPrompts(ctx, c, stdout))
	case 2:
		return cliError("approve", gf.url.String(), answerPrompt(ctx, c, stdout, pos[0], pos[1], reason))
	}
	return fmt.Errorf("approve: want no arguments (list) or <action-id> <decision>, got %q; see 'gatehouse approve --help'", pos)
}

// listPrompts prints every pending prompt, oldest first.
func listPrompts(ctx context.Context, c *client.Client, stdout io.Writer) error {
	var acts []client.Action
	cursor := ""
	for {
		page, err := c.ListActions(ctx, client.ActionListOptions{State: client.ActionPending, Cursor: cursor, Limit: 200})
		if err != nil {
			return err
		}
		acts = append(acts, page.Actions...)
		if page.NextCursor == "" || page.NextCursor == cursor {
			break
		}
		cursor = page.NextCursor
	}
	if len(acts) == 0 {
		fmt.Fprintln(stdout, "no pending prompts")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tTOOL\tEXECUTION\tAGE\tREASON")
	for _, a := range acts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", clean(a.ActionID), clean(a.ToolID), clean(a.ExecutionID),
			now.Sub(a.RequestedAt).Round(time.Second), clean(a.Reason))
	}
	return tw.Flush()
}

// answerPrompt responds to one prompt and prints the outcome. An answer
// that comes too late prints the outcome that was recorded and fails.
func answerPrompt(ctx context.Context, c *client.Client, stdout io.Writer, actionID, decision, reason string) error {
	a, err := c.Respond(ctx, actionID, client.Answer{Decision: client.Decision(decision), Reason: reason,
		ChannelID: "cli", NativePeerID: cliPeer()})
	var settled *client.SettledError
	if errors.As(err, &settled) {
		fmt.Fprintf(stdout, "action %s was already settled: %s\n", clean(actionID), outcome(settled.Recorded))
		return err
	}
	if err != nil {
		return err
	}
	// A 200 means this answer won, so the outcome is the decision given.
	state := client.ActionApproved
	if client.Decision(decision) == client.DecisionDeny {
		state = client.ActionDenied
	}
	fmt.Fprintf(stdout, "action %s (%s, execution %s): %s (%s)\n", clean(actionID), clean(a.ToolID), clean(a.ExecutionID), state, decision)
	return nil
}

// outcome describes a settled record: state, decision, who, where, when.
func outcome(r client.Action) string {
	var b strings.Builder
	b.WriteString(string(r.State))
	if r.Decision != "" {
		b.WriteString(" (" + string(r.Decision) + ")")
	}
	if by := r.DecidedBy; by != nil {
		b.WriteString(" by " + clean(by.Principal))
		if by.ChannelID != "" {
			b.WriteString(" via " + clean(by.ChannelID))
		}
	}
	if r.DecidedAt != nil {
		b.WriteString(" at " + r.DecidedAt.Format(time.RFC3339))
	}
	if r.DecisionReason != "" {
		b.WriteString(": " + clean(r.DecisionReason))
	}
	return b.String()
}

// cliPeer names this terminal in the audit: user@host.
func cliPeer() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

// clean makes a value safe for a terminal: tool ids and arguments come
// from agents, and an escape sequence could rewrite what the person reads.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, s)
}
