package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/gatehouse-dev/gatehouse/bridge"
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
	var base, token, reason, caFile string
	var timeout time.Duration
	fs.StringVar(&base, "url", defaultURL(), "gateway base `URL`")
	fs.StringVar(&token, "token", "", "bearer token: the static token, or a channel or client JWT (empty: open gateway)")
	fs.StringVar(&reason, "reason", "", "reason recorded with the answer")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "limit for each request")
	caFileFlag(fs, &caFile)
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
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("approve: --url %q: want http://host:port or https://host:port", base)
	}
	tc, err := clientTLS(caFile)
	if err != nil {
		return fmt.Errorf("approve: %w", err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	c := &approveClient{base: strings.TrimRight(base, "/"), token: token, http: &http.Client{Timeout: timeout, Transport: tr}}
	switch len(pos) {
	case 0:
		if reason != "" {
			return errors.New("approve: --reason applies only when answering a prompt")
		}
		return c.list(ctx, stdout)
	case 2:
		return c.answer(ctx, stdout, pos[0], pos[1], reason)
	}
	fs.Usage()
	return fmt.Errorf("approve: want no arguments (list) or <action-id> <decision>, got %q", pos)
}

// approveClient calls the actions API.
type approveClient struct {
	base, token string
	http        *http.Client
}

// apiError is an error answer of the API.
type apiError struct {
	Status  int
	Message string `json:"error"`
	Code    string `json:"code"`
	Details struct {
		Recorded *bridge.Record `json:"recorded"`
	} `json:"details"`
}

// Error gives the code first: it is what scripts and people match on.
func (e *apiError) Error() string { return e.Code + ": " + e.Message }

// do sends a request and decodes a 200 answer into out.
func (c *approveClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("approve: %w", explainTLS(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("approve: read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &apiError{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || e.Code == "" {
			// Not the API's JSON: a proxy, or not a gateway at all.
			return fmt.Errorf("approve: %s %s: HTTP %d: %s", method, path, resp.StatusCode, clean(strings.TrimSpace(string(data))))
		}
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("approve: %s %s: answer is not the expected JSON: %w", method, path, err)
	}
	return nil
}

// list prints every pending prompt, oldest first.
func (c *approveClient) list(ctx context.Context, stdout io.Writer) error {
	var recs []bridge.Record
	cursor := ""
	for {
		q := url.Values{"status": {bridge.StatePending}, "limit": {"200"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Actions    []bridge.Record `json:"actions"`
			NextCursor string          `json:"next_cursor"`
		}
		if err := c.do(ctx, "GET", "/v0/actions?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		recs = append(recs, page.Actions...)
		if page.NextCursor == "" || page.NextCursor == cursor {
			break
		}
		cursor = page.NextCursor
	}
	if len(recs) == 0 {
		fmt.Fprintln(stdout, "no pending prompts")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tTOOL\tEXECUTION\tAGE\tREASON")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", clean(r.ActionID), clean(r.ToolID), clean(r.ExecutionID),
			now.Sub(r.RequestedAt).Round(time.Second), clean(r.Approval.Reason))
	}
	return tw.Flush()
}

// answer responds to one prompt and prints the outcome.
func (c *approveClient) answer(ctx context.Context, stdout io.Writer, actionID, decision, reason string) error {
	body := map[string]string{"decision": decision, "reason": reason, "channel_id": "cli", "native_peer_id": cliPeer()}
	var rec bridge.Record
	err := c.do(ctx, "POST", "/v0/actions/"+url.PathEscape(actionID)+"/respond", body, &rec)
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusConflict && ae.Details.Recorded != nil {
		r := ae.Details.Recorded
		fmt.Fprintf(stdout, "action %s was already settled: %s\n", clean(actionID), outcome(*r))
		return err
	}
	if err != nil {
		return err
	}
	// A 200 means this answer won, so the outcome is the decision given.
	state := bridge.StateApproved
	if decision == bridge.DecisionDeny {
		state = bridge.StateDenied
	}
	fmt.Fprintf(stdout, "action %s (%s, execution %s): %s (%s)\n", clean(actionID), clean(rec.ToolID), clean(rec.ExecutionID), state, decision)
	return nil
}

// outcome describes a settled record: state, decision, who, where, when.
func outcome(r bridge.Record) string {
	var b strings.Builder
	b.WriteString(r.State)
	if r.Decision != "" {
		b.WriteString(" (" + r.Decision + ")")
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
	if r.Reason != "" {
		b.WriteString(": " + clean(r.Reason))
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
