package channel

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gatehouse-dev/gatehouse/bridge"
)

// The words of a card, shared by the adapters so that every channel says
// the same thing.

// Title is a card's heading: the tool a prompt asks to call.
func Title(rec bridge.Record) string {
	return "Allow " + rec.ToolID + "?"
}

// Reason is why policy asks: the rule's reason, or a default.
func Reason(rec bridge.Record) string {
	if rec.Approval.Reason != "" {
		return rec.Approval.Reason
	}
	return "Policy asks a person to approve this call."
}

// Arguments renders a prompt's arguments as indented JSON of at most limit
// bytes, cut on a rune boundary with an ellipsis when longer. The text is
// not escaped for any markup.
func Arguments(rec bridge.Record, limit int) string {
	if len(rec.Arguments) == 0 || string(rec.Arguments) == "null" {
		return "(no arguments)"
	}
	var b bytes.Buffer
	if json.Indent(&b, rec.Arguments, "", "  ") != nil {
		b.Reset()
		b.Write(rec.Arguments)
	}
	// Go's encoder writes <, > and & as \u escapes; a person reads the
	// characters (each channel escapes its own markup).
	return Clip(unescapeHTML(b.String()), limit)
}

// unescapeHTML turns the \u003c, \u003e and \u0026 escapes of JSON text
// back into their characters, leaving every other escape, an escaped
// backslash included, as it is.
func unescapeHTML(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch esc := s[i+1:]; {
		case strings.HasPrefix(esc, "u003c"):
			b.WriteByte('<')
			i += 5
		case strings.HasPrefix(esc, "u003e"):
			b.WriteByte('>')
			i += 5
		case strings.HasPrefix(esc, "u0026"):
			b.WriteByte('&')
			i += 5
		default:
			b.WriteString(s[i : i+2])
			i++
		}
	}
	return b.String()
}

// Clip cuts s to at most limit bytes on a rune boundary, ending it with an
// ellipsis when it was cut.
func Clip(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	const ell = "…"
	cut := limit - len(ell)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:max(cut, 0)] + ell
}

// Expiry says when a pending prompt expires and what that means, or "".
func Expiry(rec bridge.Record) string {
	if rec.ExpiresAt == nil {
		return ""
	}
	return "Expires " + stamp(*rec.ExpiresAt) + " (then " + expiryMeans(rec) + ")"
}

func expiryMeans(rec bridge.Record) string {
	if rec.OnExpiry == "allow" {
		return "allowed"
	}
	return "denied"
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// Outcome says how a settled prompt ended: what was decided, by whom,
// through which channel and when.
func Outcome(rec bridge.Record) string {
	var what string
	switch {
	case rec.State == bridge.StateApproved && rec.Decision == bridge.DecisionAllowAlways:
		what = "Allowed for the rest of the session"
	case rec.State == bridge.StateApproved:
		what = "Allowed once"
	case rec.State == bridge.StateDenied:
		what = "Denied"
	case rec.State == bridge.StateExpired:
		what = "Expired with no answer: " + expiryMeans(rec)
	case rec.State == bridge.StateCancelled:
		what = "Withdrawn: the execution ended"
	default:
		what = "Pending"
	}
	var b strings.Builder
	b.WriteString(what)
	if by := rec.DecidedBy; by != nil && by.Principal != "" {
		b.WriteString(" by " + by.Principal)
		if by.ChannelID != "" {
			b.WriteString(" via " + by.ChannelID)
			if by.NativePeerID != "" && by.NativePeerID != by.Principal {
				b.WriteString(" (" + by.NativePeerID + ")")
			}
		}
	}
	if rec.DecidedAt != nil {
		b.WriteString(" at " + stamp(*rec.DecidedAt))
	}
	return b.String()
}
