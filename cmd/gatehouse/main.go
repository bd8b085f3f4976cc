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
	"text/tabwriter"

	"github.com/gatehouse-dev/gatehouse/node"
)

// command is one subcommand of the binary.
type command struct {
	name    string
	args    string // what follows the name in a synopsis
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands lists the subcommands in the order the usage shows them.
func commands() []command {
	return []command{
		{"serve", "[flags]", fmt.Sprintf("run the gateway (the default: %s, data in %s)", node.Defaults().Addr, node.Defaults().Data),
			func(ctx context.Context, args []string, _, stderr io.Writer) error { return serve(ctx, args, stderr) }},
		{"runner", "[flags]", "run a runner behind NAT with built-in tools (gatehouse.echo, .time, .sha256, .sleep)", runnerCmd},
		{"agent", "[flags]", "run the example AAP agent (declares itself; answers, echoes through a runner, calls client tools)", agentCmd},
		{"tail", "[flags] <execution-id>", "follow an execution's events until it ends (resumes across disconnects)", tailCmd},
		{"approve", "[flags] [<action-id> <decision>]", "list pending permission prompts, or answer one (allow_once, allow_always or deny)", approveCmd},
		{"token", "[flags]", "mint a JWT for development", tokenCmd},
		{"bench", "[flags]", "compare builds: SDK agents and runners against an in-process (or --url) gateway (for figures to quote, bench/compare.sh)", bench},
		{"conformance", "[flags]", "check a running gateway against the specs", conformanceCmd},
		{"version", "", "print the version", versionCmd},
		{"help", "[command]", "show this help, or a command's flags", nil},
	}
}

// defaultURL is where the client commands look for a gateway unless told:
// where serve listens by default.
func defaultURL() string { return "http://" + node.Defaults().Addr }

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// usage writes the commands and the flags of serve, the default command.
func usage(w io.Writer) {
	fmt.Fprint(w, "gatehouse: an edge gateway for AI-agent execution\n\nUsage:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimSpace("gatehouse "+c.name+" "+c.args), c.summary)
	}
	_ = tw.Flush()
	fmt.Fprint(w, `
Run 'gatehouse help <command>' (or 'gatehouse <command> -h') for the flags of
a command. Every flag can also be set as an environment variable
GATEHOUSE_<FLAG>, e.g. GATEHOUSE_ADDR=0.0.0.0:8080; a flag given on the
command line wins.

Flags of serve, which also runs with no command ('gatehouse --addr ...'):
`)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(w)
	var c config
	c.flags(fs)
	fs.PrintDefaults()
}

// newFlagSet returns the flag set of a subcommand, whose usage prints the
// command's synopsis and every flag to out.
func newFlagSet(name string, out io.Writer) *flag.FlagSet {
	c, _ := lookup(name)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: gatehouse %s %s\n\n%s.\n\nFlags (each also settable as GATEHOUSE_<FLAG>):\n", c.name, c.args, strings.ToUpper(c.summary[:1])+c.summary[1:])
		fs.PrintDefaults()
	}
	return fs
}

// noArgs fails when a command that takes no arguments got some.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (flags start with -; see 'gatehouse help %s')", fs.Name(), fs.Arg(0), fs.Name())
	}
	return nil
}

func versionCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version: unexpected argument %q", args[0])
	}
	fmt.Fprintln(stdout, "gatehouse", version)
	return nil
}

// errReported is a failure that was already printed (a flag the flag
// package complained about, with the usage): main only sets the status.
type errReported struct{ err error }

func (e errReported) Error() string { return e.err.Error() }
func (e errReported) Unwrap() error { return e.err }

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	oversubscribeProcs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		var done errReported
		if !errors.As(err, &done) {
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

// run runs the command named by args[0], or serve when args is empty or
// starts with a flag. A request for help (help, -h, --help) succeeds.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	name := "serve"
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		usage(stdout)
		return nil
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		name, args = args[0], args[1:]
	}
	if name == "help" {
		if len(args) == 0 {
			usage(stdout)
			return nil
		}
		c, ok := lookup(args[0])
		if !ok || c.run == nil || len(args) > 1 {
			usage(stderr)
			return fmt.Errorf("help: unknown command %q", strings.Join(args, " "))
		}
		if c.name == "version" {
			fmt.Fprintf(stdout, "Usage: gatehouse version\n\n%s.\n", strings.ToUpper(c.summary[:1])+c.summary[1:])
			return nil
		}
		// The command prints its own usage on -h; here it goes to stdout.
		name, args, stderr = c.name, []string{"-h"}, stdout
	}
	c, ok := lookup(name)
	if !ok || c.run == nil {
		usage(stderr)
		return fmt.Errorf("unknown command %q", name)
	}
	err := c.run(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// parseFlags parses args, then fills every flag not given on the command
// line from its GATEHOUSE_* environment variable.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errReported{err} // the flag package printed it, with the usage
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
