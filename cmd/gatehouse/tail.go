package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
)

// tailCmd follows an execution's events from a sequence until its terminal
// event, resuming across disconnects with no gap and no duplicate.
func tailCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var url, token string
	var after uint64
	var raw bool
	fs.StringVar(&url, "url", "http://127.0.0.1:8080", "gateway base URL")
	fs.StringVar(&token, "token", "", "bearer token")
	fs.Uint64Var(&after, "after", 0, "start after this sequence")
	fs.BoolVar(&raw, "json", false, "print each event as one line of JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gatehouse tail [flags] <execution-id>")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("tail: give one execution id")
	}
	c, err := client.New(client.Options{BaseURL: url, Token: token})
	if err != nil {
		return err
	}
	return c.StreamExecution(ctx, fs.Arg(0), after, func(ev client.Event) error {
		if raw {
			line, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s\n", line)
			return err
		}
		step := ""
		if ev.StepID != "" {
			step = " step=" + ev.StepID
		}
		_, err := fmt.Fprintf(stdout, "%5d %s %-24s%s %s\n", ev.Sequence, ev.Timestamp.Format(time.RFC3339Nano),
			ev.Type, step, printable(string(ev.Payload)))
		return err
	})
}

// printable keeps a terminal safe from control characters in payloads.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
