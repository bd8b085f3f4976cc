// Package ident is the one rule for the ids that clients choose: agent,
// runner, consumer, channel, peer, session, tool and account ids, signal
// types, idempotency keys, and the ids a client names in a path or a body.
//
// An id is 1 to [MaxLen] bytes of UTF-8 holding no control character
// (Unicode category Cc: NUL, tab, CR, LF, ESC, DEL, C1), no format
// character (Cf: bidirectional overrides and isolates, zero-width spaces
// and joiners, the byte order mark, soft hyphens) and no line or paragraph
// separator (U+2028, U+2029). Ids are echoed into logs, event streams,
// store keys and the approvals page: a control character can forge a log
// line or an SSE field, and a format character can make one id display as
// another to the person approving it ("bash" with a zero-width space, a
// tool name reversed by U+202E).
//
// Fields may narrow the rule where they are used: a channel id holds no
// '/', and a session id, which clients put into URL paths unescaped, only
// letters, digits and - _ . ~ : .
package ident

import (
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxLen bounds an id, in bytes.
const MaxLen = 256

// ErrInvalid reports an id that breaks the rule; every error of [Check]
// wraps it.
var ErrInvalid = errors.New("invalid id")

// Error is an id that breaks the rule. Its message names the field and
// what is wrong, never the id: an id that breaks the rule may hold exactly
// what must not be echoed.
type Error struct {
	Field  string // the field's name, as the request spells it
	Reason string // what is wrong, e.g. "is empty"
}

func (e *Error) Error() string { return e.Field + " " + e.Reason }

// Unwrap makes an Error match ErrInvalid.
func (e *Error) Unwrap() error { return ErrInvalid }

// Check checks id, named field in the error. An empty id is refused:
// callers skip optional fields that were left out.
//
// A length error reads "<field> exceeds maximum length of 256 characters",
// the kernel API's message, which its clients may match.
func Check(field, id string) error {
	return CheckLen(field, id, MaxLen)
}

// CheckLen is Check with a bound of maxLen bytes, for fields narrower than
// MaxLen.
func CheckLen(field, id string, maxLen int) error {
	switch {
	case id == "":
		return &Error{field, "is empty"}
	case len(id) > maxLen:
		return &Error{field, fmt.Sprintf("exceeds maximum length of %d characters", maxLen)}
	}
	for i, r := range id {
		if reason := refused(r, id[i:]); reason != "" {
			return &Error{field, reason + " at byte " + strconv.Itoa(i) + ": ids are UTF-8 without control or format characters"}
		}
	}
	return nil
}

// refused says why r, the rune at the start of rest, cannot be in an id;
// "" when it can.
func refused(r rune, rest string) string {
	switch {
	case r == utf8.RuneError:
		if _, size := utf8.DecodeRuneInString(rest); size <= 1 {
			return "is not UTF-8"
		}
		return ""
	case unicode.Is(unicode.Cc, r):
		return fmt.Sprintf("holds control character U+%04X", r)
	case unicode.Is(unicode.Cf, r):
		return fmt.Sprintf("holds format character U+%04X", r)
	case r == '\u2028' || r == '\u2029':
		return fmt.Sprintf("holds line separator U+%04X", r)
	}
	return ""
}
