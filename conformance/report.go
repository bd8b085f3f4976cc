package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Summary counts results by status.
type Summary struct {
	Pass int `json:"pass"`
	Fail int `json:"fail"`
	Skip int `json:"skip"`
}

// Summarize counts results by status.
func Summarize(results []Result) Summary {
	var s Summary
	for _, r := range results {
		switch r.Status {
		case Pass:
			s.Pass++
		case Fail:
			s.Fail++
		case Skip:
			s.Skip++
		}
	}
	return s
}

// Table writes results as the rows of a table, one at a time, in columns
// sized beforehand for the checks it may hold: rows can be written as the
// checks end, before the last one has.
type Table struct {
	w           io.Writer
	idW, specW  int
	wroteHeader bool
}

// NewTable returns a Table for results of checks (Checks() for any).
func NewTable(w io.Writer, checks []Check) *Table {
	t := &Table{w: w, idW: len("CHECK"), specW: len("SPEC")}
	for _, c := range checks {
		t.idW = max(t.idW, utf8.RuneCountInString(c.ID))
		t.specW = max(t.specW, utf8.RuneCountInString(c.Spec))
	}
	return t
}

// Row writes one result (status, id, duration, spec, and the reason of a
// failure or skip), after the header line if it is the first.
func (t *Table) Row(r Result) error {
	if !t.wroteHeader {
		t.wroteHeader = true
		if err := t.line("STATUS", "CHECK", "TIME", "SPEC", "REASON"); err != nil {
			return err
		}
	}
	return t.line(strings.ToUpper(string(r.Status)), r.ID, r.Duration.Round(time.Millisecond).String(), r.Spec, strings.ReplaceAll(r.Reason, "\n", " "))
}

func (t *Table) line(status, id, took, spec, reason string) error {
	l := fmt.Sprintf("%-6s  %-*s  %-8s  %-*s  %s", status, t.idW, id, took, t.specW, spec, reason)
	_, err := fmt.Fprintln(t.w, strings.TrimRight(l, " "))
	return err
}

// WriteTable writes one line per check (status, id, duration, spec, and
// the reason of a failure or skip), then the summary.
func WriteTable(w io.Writer, results []Result) error {
	checks := make([]Check, len(results))
	for i, r := range results {
		checks[i] = Check{ID: r.ID, Spec: r.Spec}
	}
	t := NewTable(w, checks)
	for _, r := range results {
		if err := t.Row(r); err != nil {
			return err
		}
	}
	return WriteSummary(w, results)
}

// WriteSummary writes how many checks ran, the ids of those that failed,
// and the count of each outcome.
func WriteSummary(w io.Writer, results []Result) error {
	var failed []string
	for _, r := range results {
		if r.Status == Fail {
			failed = append(failed, r.ID)
		}
	}
	fmt.Fprintf(w, "\n%d checks\n", len(results))
	if len(failed) > 0 {
		fmt.Fprintf(w, "failed: %s\n", strings.Join(failed, ", "))
	}
	s := Summarize(results)
	_, err := fmt.Fprintf(w, "conformance: %d passed, %d failed, %d skipped\n", s.Pass, s.Fail, s.Skip)
	return err
}

// MarshalJSON renders the duration in milliseconds, as duration_ms.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result // without this method, so Marshal does not recurse
	return json.Marshal(struct {
		plain
		DurationMS float64 `json:"duration_ms"`
	}{plain(r), float64(r.Duration.Microseconds()) / 1000})
}

// WriteJSON writes {"results": [...], "summary": {...}}.
func WriteJSON(w io.Writer, results []Result) error {
	if results == nil {
		results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Results []Result `json:"results"`
		Summary Summary  `json:"summary"`
	}{results, Summarize(results)})
}
