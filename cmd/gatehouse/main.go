// Command gatehouse is the Gatehouse edge gateway: `gatehouse serve` runs it,
// the other subcommands are clients and tools around it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
)

const usage = `gatehouse: an edge gateway for AI-agent execution

Usage:
  gatehouse serve [flags]      run the gateway (default: 127.0.0.1:8080, data in ./gatehouse-data)
  gatehouse bench [flags]      measure end-to-end executions against an in-process gateway
  gatehouse token [flags]      mint a JWT for development (--secret, --role, --agents, --runners)
  gatehouse runner [flags]     run a runner behind NAT with built-in tools (gatehouse.echo, .time, .sha256, .sleep)
  gatehouse tail [flags] <id>  follow an execution's events until it ends (resumes across disconnects)
  gatehouse approve [flags]    list pending permission prompts, or answer one: <action-id> allow_once|allow_always|deny
  gatehouse conformance [flags] check a running gateway against the specs (--url, --token, --restart-cmd, --json)
  gatehouse version            print the version

Run 'gatehouse <command> -h' for the flags of a command. Every flag can also be
set as an environment variable GATEHOUSE_<FLAG>, e.g. GATEHOUSE_ADDR=0.0.0.0:8080.
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	oversubscribeProcs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gatehouse:", err)
		}
		os.Exit(2)
	}
}

// oversubscribeProcs runs twice as many Ps (Go's processors) as the runtime
// would by default (one per CPU the process may use), unless GOMAXPROCS is
// set. The store's committer blocks in a synchronous disk write for every
// group, and when the write returns it must win a P back before it can
// answer anyone; with every P busy it waits behind request handlers, and
// every writer waits with it. With a spare P it goes on at once. Measured
// with `gatehouse bench` on 2 CPUs: 2,400 executions/s and p99 44 ms with
// 2 Ps, 2,800-2,900/s and p99 22-29 ms with 4.
func oversubscribeProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2 * runtime.GOMAXPROCS(0))
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, stderr)
	case "bench":
		return bench(ctx, args, stdout, stderr)
	case "token":
		return tokenCmd(ctx, args, stdout, stderr)
	case "approve":
		return approveCmd(ctx, args, stdout, stderr)
	case "runner":
		return runnerCmd(ctx, args, stdout, stderr)
	case "tail":
		return tailCmd(ctx, args, stdout, stderr)
	case "conformance":
		return conformanceCmd(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "gatehouse", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// parseFlags parses args, then fills every flag not given on the command
// line from its GATEHOUSE_* environment variable.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := "GATEHOUSE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}
