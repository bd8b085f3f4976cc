package cluster

import (
	"context"
	"fmt"
	"log/slog"
)

// natsLogger writes the NATS server's lines to a slog.Logger: notices as
// info, traces (the protocol, line by line) not at all.
type natsLogger struct{ l *slog.Logger }

func newLogger(l *slog.Logger) *natsLogger { return &natsLogger{l: l.With("component", "nats")} }

func (n *natsLogger) Noticef(format string, v ...any) { n.log(slog.LevelInfo, format, v) }
func (n *natsLogger) Warnf(format string, v ...any)   { n.log(slog.LevelWarn, format, v) }
func (n *natsLogger) Errorf(format string, v ...any)  { n.log(slog.LevelError, format, v) }
func (n *natsLogger) Debugf(format string, v ...any)  { n.log(slog.LevelDebug, format, v) }
func (n *natsLogger) Tracef(string, ...any)           {}

// Fatalf is an error the embedded server cannot go on from; unlike NATS's
// own logger it does not end the process, which is the node's to stop.
func (n *natsLogger) Fatalf(format string, v ...any) { n.log(slog.LevelError, format, v) }

func (n *natsLogger) log(level slog.Level, format string, v []any) {
	if !n.l.Enabled(context.Background(), level) {
		return
	}
	n.l.Log(context.Background(), level, fmt.Sprintf(format, v...))
}
