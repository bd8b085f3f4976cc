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
	"runtime/debug"
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
		{"serve", "[flags]", fmt.Sprintf("run the gateway (by default on %s, data in %s)", node.Defaults().Addr, node.Defaults().Data),
			func(ctx context.Context, args []string, _, stderr io.Writer) error { return serve(ctx, args, stderr) }},
		{"runner", "[flags]", "run a runner behind NAT with built-in tools (gatehouse.echo, .time, .sha256, .sleep)", runnerCmd},
		{"agent", "[flags]", "run the example AAP agent (declares itself; answers, echoes through a runner, calls client tools)", agentCmd},
		{"tail", "[flags] <execution-id>", "follow an execution's events until it ends (resumes across disconnects)", tailCmd},
		{"approve", "[flags] [<action-id> <decision>]", "list pending permission prompts, or answer one (allow_once, allow_always or deny)", approveCmd},
		{"token", "[flags]", "mint a JWT for development", tokenCmd},
		{"bench", "[flags]", "compare builds: SDK agents and runners against an in-process (or --url) gateway (for figures to quote, bench/compare.sh)", bench},
		{"conformance", "[flags]", "check a running gateway against the specs", conformanceCmd},
		{"version", "", "print the version: the module's, the VCS revision it was built from, and Go's (also --version)", versionCmd},
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

// usage writes the commands, each with its synopsis; `gatehouse help
// <command>` shows a command's flags.
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
`)
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
		return fmt.Errorf("%s: unexpected argument %q (flags start with -; see 'gatehouse %s --help')", fs.Name(), fs.Arg(0), fs.Name())
	}
	return nil
}

func versionCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version: unexpected argument %q", args[0])
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, describeBuild(bi))
	return nil
}

// describeBuild says which build a binary is, from its build information:
// the main module's version (a tag, a pseudo-version, or "(devel)"), the
// VCS revision and commit time it was built from and whether the tree had
// changes, and the Go version and platform. bi may be nil (a binary built
// without module support).
func describeBuild(bi *debug.BuildInfo) string {
	if bi == nil {
		return "gatehouse (no build information) " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	}
	var rev, at string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	out := "gatehouse " + v
	if rev != "" {
		vcs := []string{"revision " + rev[:min(len(rev), 12)]}
		if at != "" {
			vcs = append(vcs, at)
		}
		if modified {
			vcs = append(vcs, "modified")
		}
		out += " (" + strings.Join(vcs, ", ") + ")"
	}
	return out + " " + bi.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}

func main() {
	oversubscribeProcs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gatehouse:", err)
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

// run runs the command named by args[0]. A request for help (help, -h,
// --help) or the version (--version) succeeds; no command at all shows the
// help and fails, since serving by accident into a folder of the current
// directory is worse than a word about what to type. A failure's error is
// one line, to print last.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return errors.New("no command given; 'gatehouse serve' runs the gateway")
	}
	name, args := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		usage(stdout)
		return nil
	case "-version", "--version":
		name = "version"
	case "help":
		if len(args) == 0 {
			usage(stdout)
			return nil
		}
		c, ok := lookup(args[0])
		if !ok || c.run == nil || len(args) > 1 {
			return fmt.Errorf("help: %s", unknownCommand(strings.Join(args, " ")))
		}
		if c.name == "version" {
			fmt.Fprintf(stdout, "Usage: gatehouse version\n\n%s.\n", strings.ToUpper(c.summary[:1])+c.summary[1:])
			return nil
		}
		// The command prints its own usage on -h; here it goes to stdout.
		name, args, stderr = c.name, []string{"-h"}, stdout
	}
	if strings.HasPrefix(name, "-") {
		return fmt.Errorf("%s is not a command: flags come after one, as in 'gatehouse serve %s'; see 'gatehouse --help'", name, name)
	}
	c, ok := lookup(name)
	if !ok || c.run == nil {
		return errors.New(unknownCommand(name))
	}
	err := c.run(ctx, args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// unknownCommand says that name is no command, with the nearest one when a
// typo seems likely.
func unknownCommand(name string) string {
	var names []string
	for _, c := range commands() {
		if c.run != nil {
			names = append(names, c.name)
		}
	}
	msg := fmt.Sprintf("unknown command %q", name)
	if near := nearest(name, names); near != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", near)
	}
	return msg + "; see 'gatehouse --help'"
}

// parseFlags parses args, then fills every flag not given on the command
// line from its GATEHOUSE_* environment variable. On -h it prints the
// command's usage and returns flag.ErrHelp; a flag it cannot take is one
// line of error, with the nearest flag name for a typo, not the usage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return flagError(fs, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
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

// flagError words a parse error of fs in one line: what is wrong, the
// nearest flag to one it does not know, and where the flags are listed.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "unknown flag --" + name
		if near := nearest(name, names); near != "" {
			msg += " (did you mean --" + near + "?)"
		}
	}
	return fmt.Errorf("%s: %s; see 'gatehouse %s --help'", fs.Name(), msg, fs.Name())
}

// nearest returns the candidate closest to name by edit distance, when it
// is close enough to be a typo of it (at most two edits, and fewer than
// name has letters); "" when none is.
func nearest(name string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), c); d < bestD && d < len(name) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
