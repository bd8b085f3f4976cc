package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatehouse-dev/gatehouse/internal/eventually"
	"github.com/gatehouse-dev/gatehouse/internal/loopback"
	"github.com/gatehouse-dev/gatehouse/node"
	"github.com/gatehouse-dev/gatehouse/node/nodetest"
)

// serveFlags lists the flags of serve.
func serveFlags() []string {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var c config
	c.flags(fs)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// TestHelpShowsEveryCommandAndFlag: --help lists every command, on one
// screen; help <command> and <command> -h show that command's flags; all
// of them succeed.
func TestHelpShowsEveryCommandAndFlag(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, c := range commands() {
			if !strings.Contains(out.String(), "gatehouse "+c.name) {
				t.Errorf("%v does not list %s:\n%s", args, c.name, out.String())
			}
		}
		if lines := strings.Count(out.String(), "\n"); lines > 24 {
			t.Errorf("%v is %d lines, more than a screen:\n%s", args, lines, out.String())
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help", "serve"}, &out, io.Discard); err != nil {
		t.Fatalf("help serve: %v", err)
	}
	for _, f := range serveFlags() {
		if !strings.Contains(out.String(), "  -"+f) {
			t.Errorf("help serve does not show -%s", f)
		}
	}
	for _, c := range commands() {
		if c.run == nil {
			continue
		}
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"help", c.name}, &out, &errOut); err != nil || !strings.Contains(out.String(), "Usage") {
			t.Errorf("help %s: %v\n%s%s", c.name, err, out.String(), errOut.String())
		}
		if c.name == "version" {
			continue
		}
		errOut.Reset()
		if err := run(context.Background(), []string{c.name, "-h"}, io.Discard, &errOut); err != nil || !strings.Contains(errOut.String(), "-url") && !strings.Contains(errOut.String(), "-addr") && !strings.Contains(errOut.String(), "-secret") {
			t.Errorf("%s -h: %v\n%s", c.name, err, errOut.String())
		}
	}
	if err := run(context.Background(), []string{"help", "nope"}, io.Discard, io.Discard); err == nil {
		t.Error("help for an unknown command succeeded")
	}
}

// TestStrayArgumentsAreRefused: serve (and the other commands without
// positional arguments) refuse one, instead of ignoring it and every flag
// after it.
func TestStrayArgumentsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--in-memory", "--addr", "127.0.0.1:0", "extra"},
		{"runner", "--url", "http://127.0.0.1:1", "extra"},
		{"token", "--secret", strings.Repeat("s", 32), "extra"},
		{"version", "extra"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, args, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
			t.Errorf("%v: %v, want unexpected argument", args, err)
		}
	}
}

// TestTailFailsFast: tail against a gateway that is not there, or for an
// execution that does not exist, fails with one clear line instead of
// retrying for ever.
func TestTailFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dead := "http://" + loopback.FreeAddr(t)
	err := tailCmd(ctx, []string{"--url", dead, "some-execution"}, io.Discard, io.Discard)
	if ctx.Err() != nil {
		t.Fatal("tail against a dead URL was still retrying after 60s")
	}
	if err == nil || !strings.HasPrefix(err.Error(), "tail: cannot reach "+dead+": ") {
		t.Fatalf("dead URL: %v", err)
	}
	s := nodetest.Start(t, node.Options{})
	err = tailCmd(ctx, []string{"--url", s.URL, "no-such-execution"}, io.Discard, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "tail: NOT_FOUND: ") || strings.Contains(err.Error(), "gatehouse:") {
		t.Fatalf("unknown execution: %v", err)
	}
	// As main prints it: one prefix.
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "tail", "--url", s.URL, "no-such-execution")
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || strings.Count(out.String(), "gatehouse:") != 1 || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("gatehouse tail: %v\n%s", err, out.String())
	}
}

// TestStopExitsZero: SIGTERM ends serve with status 0 after a clean
// shutdown, also when it arrives while the gateway is still starting.
func TestStopExitsZero(t *testing.T) {
	c := startChild(t, loopback.FreeAddr(t), t.TempDir())
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, c.logs)
	}
	// A stop while starting, as serve sees it: its context is already done.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := serve(ctx, []string{"--addr", "127.0.0.1:0", "--data", t.TempDir()}, io.Discard); err != nil {
		t.Fatalf("serve stopped while starting: %v", err)
	}
}

// TestRunnerKeepsItsConsumerID: `gatehouse runner` connects under the same
// consumer id after a restart, so the gateway knows one consumer.
func TestRunnerKeepsItsConsumerID(t *testing.T) {
	s := nodetest.Start(t, node.Options{})
	host, _ := os.Hostname()
	want := hostConsumerID(host)
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- runnerCmd(ctx, []string{"--url", s.URL, "--runner-id", "edge-9", "--log-level", "error"}, io.Discard, io.Discard)
		}()
		deadline := time.Now().Add(20 * time.Second)
		for online := false; !online; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the runner did not come online within 20s")
			}
			resp, err := http.Get(s.URL + "/v0/peers?role=runner")
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Peers []struct {
					ID, State  string
					ConsumerID string `json:"consumer_id"`
				}
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			// The built-in memory runner is always there.
			body.Peers = slices.DeleteFunc(body.Peers, func(p struct {
				ID, State  string
				ConsumerID string `json:"consumer_id"`
			}) bool {
				return p.ID == "gatehouse.memory"
			})
			if len(body.Peers) == 0 {
				continue // not connected yet
			}
			if len(body.Peers) != 1 || body.Peers[0].ID != "edge-9" || body.Peers[0].ConsumerID != want {
				t.Fatalf("peers %+v, want one runner edge-9/%s", body.Peers, want)
			}
			online = body.Peers[0].State == "online"
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestHostConsumerID(t *testing.T) {
	for in, want := range map[string]string{
		"edge-1": "edge-1", "Edge-1.Example.COM": "edge-1.example.com", "my host_1": "my-host-1",
		"": "runner", "---": "runner", "hôte": "h-te", strings.Repeat("x", 200): "runner",
	} {
		if got := hostConsumerID(in); got != want {
			t.Errorf("hostConsumerID(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestServeRefusesNetworkWithoutCredentials: serve with no token or JWT
// key on an address other hosts can reach exits 2 with one line that says
// what to do, listening on nothing; --insecure-no-auth serves it and warns.
func TestServeRefusesNetworkWithoutCredentials(t *testing.T) {
	_, port, _ := net.SplitHostPort(loopback.FreeAddr(t))
	addr := "0.0.0.0:" + port
	var out bytes.Buffer
	// A serve that does not refuse would run until killed.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "serve", "--addr", addr, "--data", t.TempDir())
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("serve on %s without credentials: %v, want exit status 2\n%s", addr, err, out.String())
	}
	line := out.String()
	if strings.Count(line, "\n") != 1 || !strings.HasPrefix(line, "gatehouse: serve: no credentials on a non-loopback address: ") {
		t.Fatalf("want one line naming the refusal, got:\n%s", line)
	}
	for _, advice := range []string{addr, "--token", "--jwt-secret", "--addr 127.0.0.1:" + port, "--insecure-no-auth"} {
		if !strings.Contains(line, advice) {
			t.Errorf("the refusal does not say %q: %s", advice, line)
		}
	}
	if conn, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
		conn.Close()
		t.Fatalf("something listens on %s after the refusal", port)
	}

	c := newChild(addr, t.TempDir(), "--insecure-no-auth", "--log-level", "info")
	c.base = "http://127.0.0.1:" + port
	c.start(t)
	resp, err := http.Get(c.base + "/v0/executions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v0/executions with --insecure-no-auth: %d", resp.StatusCode)
	}
	// The gateway answers before serve has logged its start: wait for the
	// warning rather than stop the process under it.
	eventually.Check(t, func() error {
		if l := c.logs.String(); !strings.Contains(l, "--insecure-no-auth") || !strings.Contains(l, "level=WARN") {
			return fmt.Errorf("no warning about --insecure-no-auth in the log:\n%s", l)
		}
		return nil
	})
}

// runMain runs the binary as main with args in the folder dir and returns
// what it wrote (stdout and stderr together) and its exit status. A run
// that does not end within 20s is killed: a gateway serving by mistake.
func runMain(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GATEHOUSE_TEST_AS_MAIN=1")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit) && ctx.Err() == nil:
		return out.String(), exit.ExitCode()
	}
	t.Fatalf("gatehouse %v: %v\n%s", args, err, out.String())
	return "", 0
}

// TestNoCommandShowsHelpAndServesNothing: a bare gatehouse shows the
// commands and fails with one last line saying how to serve, without
// creating a data folder; flags with no command before them are refused
// in one line.
func TestNoCommandShowsHelpAndServesNothing(t *testing.T) {
	dir := t.TempDir()
	out, code := runMain(t, dir)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 2 || !strings.Contains(out, "gatehouse serve [flags]") ||
		lines[len(lines)-1] != "gatehouse: no command given; 'gatehouse serve' runs the gateway" {
		t.Fatalf("gatehouse: exit %d\n%s", code, out)
	}
	out, code = runMain(t, dir, "--addr", "127.0.0.1:0", "--in-memory")
	if code != 2 || out != "gatehouse: --addr is not a command: flags come after one, as in 'gatehouse serve --addr'; see 'gatehouse --help'\n" {
		t.Fatalf("gatehouse --addr: exit %d\n%s", code, out)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("the working folder holds %v (%v), want nothing", entries, err)
	}
}

// TestMistypedFlagOrCommandIsOneLine: a flag or command that does not
// exist, or a flag's bad value, is one line, with the nearest name for a
// typo and where to look, instead of the usage.
func TestMistypedFlagOrCommandIsOneLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--adr", "0.0.0.0:8080"}, "serve: unknown flag --adr (did you mean --addr?); see 'gatehouse serve --help'"},
		{[]string{"serve", "-polcy", "p.yaml"}, "serve: unknown flag --polcy (did you mean --policy?); see 'gatehouse serve --help'"},
		{[]string{"serve", "--frobnicate"}, "serve: unknown flag --frobnicate; see 'gatehouse serve --help'"},
		{[]string{"serve", "--max-body", "lots"}, `serve: invalid value "lots" for flag -max-body: parse error; see 'gatehouse serve --help'`},
		{[]string{"runner", "--runer-id", "edge-1"}, "runner: unknown flag --runer-id (did you mean --runner-id?); see 'gatehouse runner --help'"},
		{[]string{"conformance", "--restart-cm", "true"}, "conformance: unknown flag --restart-cm (did you mean --restart-cmd?); see 'gatehouse conformance --help'"},
		{[]string{"tail", "--url"}, "tail: flag needs an argument: -url; see 'gatehouse tail --help'"},
		{[]string{"tail"}, "tail: give one execution id; see 'gatehouse tail --help'"},
		{[]string{"serv"}, `unknown command "serv" (did you mean "serve"?); see 'gatehouse --help'`},
		{[]string{"help", "runer"}, `help: unknown command "runer" (did you mean "runner"?); see 'gatehouse --help'`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"; see 'gatehouse --help'`},
	} {
		out, code := runMain(t, dir, tc.args...)
		if code != 2 || out != "gatehouse: "+tc.want+"\n" {
			t.Errorf("gatehouse %v: exit %d\n%s\nwant exit 2 and the one line\ngatehouse: %s", tc.args, code, out, tc.want)
		}
	}
}

// TestVersionNamesTheBuild: --version, -version and the version command
// print one line naming the build: the module version, and Go's.
func TestVersionNamesTheBuild(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		out, code := runMain(t, t.TempDir(), args...)
		if code != 0 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "gatehouse ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("gatehouse %v: exit %d: %q", args, code, out)
		}
	}
}

// TestDescribeBuild: the version line names the module version, the VCS
// revision (12 digits), its time and a modified tree, from the build
// information the Go tool stamps.
func TestDescribeBuild(t *testing.T) {
	platform := " go1.26.0 " + runtime.GOOS + "/" + runtime.GOARCH
	vcs := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"tagged", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"},
			Settings: vcs("vcs", "git", "vcs.revision", "0123456789abcdef0123", "vcs.time", "2026-11-27T03:32:50Z", "vcs.modified", "false")},
			"gatehouse v1.4.0 (revision 0123456789ab, 2026-11-27T03:32:50Z)" + platform},
		{"modified checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.0.0-20261127033250-0123456789ab+dirty"},
			Settings: vcs("vcs.revision", "0123456789abcdef0123", "vcs.time", "2026-11-27T03:32:50Z", "vcs.modified", "true")},
			"gatehouse v0.0.0-20261127033250-0123456789ab+dirty (revision 0123456789ab, 2026-11-27T03:32:50Z, modified)" + platform},
		{"no VCS (go run, -buildvcs=false)", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"gatehouse (devel)" + platform},
		{"no module version", &debug.BuildInfo{GoVersion: "go1.26.0"}, "gatehouse (devel)" + platform},
		{"no build information", nil, "gatehouse (no build information) " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH},
	} {
		if got := describeBuild(tc.bi); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}
