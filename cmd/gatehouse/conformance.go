package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/gatehouse-dev/gatehouse/conformance"
)

const conformanceUsage = `Usage: gatehouse conformance --url URL [flags]

Runs the conformance suite against a running gateway (Gatehouse or another
implementation of the same API) and prints one line per check: pass, fail, or
skip with the reason. The exit status is non-zero when a check fails.

Flags:
`

// conformanceCmd runs the black-box conformance suite against a gateway.
func conformanceCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		o        conformance.Options
		asJSON   bool
		list     bool
		patterns stringList
		caFile   string
	)
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, conformanceUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.URL, "url", defaultURL(), "base `URL` of the gateway under test")
	fs.StringVar(&o.Token, "token", "", "admin bearer `token`, when the server requires one")
	caFileFlag(fs, &caFile)
	fs.StringVar(&o.RestartCmd, "restart-cmd", "", "shell `command` (run with sh -c) that restarts the server on the same data and address; checks needing a restart are skipped without it")
	fs.DurationVar(&o.Timeout, "timeout", 30*time.Second, "time limit of each check")
	fs.IntVar(&o.Parallel, "parallel", 8, "checks run at once")
	fs.StringVar(&o.DeniedTool, "denied-tool", "shell", "a tool `id` the server's policy denies")
	fs.StringVar(&o.ApprovalTool, "approval-tool", "", "a tool `id` the server's policy sends to human approval (approval checks skip without it)")
	fs.StringVar(&o.RunnerToken, "runner-token", "", "a `token` scoped to the one runner --runner-token-id (token-scope checks skip without it)")
	fs.StringVar(&o.RunnerTokenID, "runner-token-id", "", "the runner `id` --runner-token is scoped to")
	fs.StringVar(&o.AgentToken, "agent-token", "", "a `token` scoped to the one agent --agent-token-id (token-scope checks skip without it)")
	fs.StringVar(&o.AgentTokenID, "agent-token-id", "", "the agent `id` --agent-token is scoped to")
	fs.StringVar(&o.ClientToken, "client-token", "", "a client `token` (ownership checks skip without it and --other-client-token)")
	fs.StringVar(&o.AAPAgent, "aap-agent", "", "`name` of a running AAP agent, such as `gatehouse agent`'s (its check skips without it)")
	fs.StringVar(&o.OtherClientToken, "other-client-token", "", "a client `token` of another principal than --client-token")
	fs.Var(&patterns, "run", "run only checks whose id matches this `regexp` (repeatable)")
	fs.BoolVar(&asJSON, "json", false, "print the results as JSON")
	fs.BoolVar(&list, "list", false, "list the checks and exit")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("conformance: unexpected argument %q", fs.Arg(0))
	}
	if list {
		for _, c := range conformance.Checks() {
			fmt.Fprintf(stdout, "%-32s %s\n", c.ID, c.Spec)
		}
		return nil
	}
	tc, err := clientTLS(caFile)
	if err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	if tc != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		tr.TLSClientConfig = tc
		o.HTTPClient = &http.Client{Transport: tr}
	}
	// Each check's line as it ends: on stdout as the table, or on stderr
	// while stdout waits for the JSON.
	progress := stdout
	if asJSON {
		progress = stderr
	}
	table := conformance.NewTable(progress, conformance.Checks())
	o.Progress = func(r conformance.Result) { _ = table.Row(r) }
	results, err := conformance.Run(ctx, o, patterns...)
	if err != nil {
		return explainTLS(err)
	}
	if len(results) == 0 {
		return errors.New("conformance: no check matches --run")
	}
	if asJSON {
		err = conformance.WriteJSON(stdout, results)
	} else {
		err = conformance.WriteSummary(stdout, results)
	}
	if err != nil {
		return err
	}
	if s := conformance.Summarize(results); s.Fail > 0 {
		return fmt.Errorf("conformance: %d of %d checks failed", s.Fail, len(results))
	}
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return fmt.Sprint(*l) }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}
