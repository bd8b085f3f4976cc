package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gatehouse-dev/gatehouse/client"
)

// tailCmd follows an execution's events from a sequence until its terminal
// event, resuming across disconnects with no gap and no duplicate. It first
// reads the execution once, so that a gateway it cannot reach, or an
// unknown execution, fails at once instead of being retried for ever;
// once following, it rides out disconnects until interrupted.
func tailCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tail", stderr)
	var gf gatewayFlags
	var after uint64
	var raw bool
	var timeout time.Duration
	var logLevel string
	gf.add(fs, "bearer token")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error (of the lines on stderr about the connection dropping and resuming)")
	fs.Uint64Var(&after, "after", 0, "start after this sequence")
	fs.BoolVar(&raw, "json", false, "print each event as one line of JSON")
	fs.DurationVar(&timeout, "timeout", 30*time.Second, "limit for reaching the gateway and each request")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("tail: give one execution id; see 'gatehouse tail --help'")
	}
	id := fs.Arg(0)
	log, err := newLogger(stderr, logLevel, "text")
	if err != nil {
		return err
	}
	c, err := gf.client("tail", client.Options{RequestTimeout: timeout, Logger: log})
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	_, err = c.GetExecution(pctx, id)
	cancel()
	if err == nil {
		err = c.StreamExecution(ctx, id, after, func(ev client.Event) error {
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
	switch {
	case err == nil, ctx.Err() != nil:
		return nil // the end of the execution, or interrupted
	}
	return cliError("tail", gf.url.String(), err)
}

// cliError says what went wrong in a client command in one line with one
// prefix: the API's code and message, or which gateway could not be
// reached and why. A nil err stays nil.
func cliError(cmd, base string, err error) error {
	var aerr *client.APIError
	var nerr *net.OpError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &aerr):
		code := aerr.Code
		if code == "" {
			code = http.StatusText(aerr.Status)
		}
		msg := cmd + ": " + code + ": " + printable(aerr.Message)
		if aerr.Code == "" && aerr.Status == http.StatusNotFound {
			// Not the API's answer: the URL leads elsewhere.
			msg += " (is " + base + " a gateway's base URL?)"
		}
		return &apiFailure{msg: msg, err: err}
	case untrustedCert(err):
		return fmt.Errorf("%s: %w", cmd, explainTLS(err))
	case errors.As(err, &nerr):
		return fmt.Errorf("%s: cannot reach %s: %w", cmd, base, nerr)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %s did not answer in time", cmd, base)
	}
	return fmt.Errorf("%s: %w", cmd, err)
}

// apiFailure is an API's refusal worded for a terminal; it still matches
// the client's sentinels (errors.Is(err, client.ErrConflict)).
type apiFailure struct {
	msg string
	err error
}

func (e *apiFailure) Error() string { return e.msg }
func (e *apiFailure) Unwrap() error { return e.err }

// printable keeps a terminal safe from control characters in payloads.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
