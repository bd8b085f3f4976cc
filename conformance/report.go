package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
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

// WriteTable writes one line per check (status, id, duration, spec, and
// the reason of a failure or skip), then a summary line.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tCHECK\tTIME\tSPEC\tREASON")
	var total time.Duration
	for _, r := range results {
		total += r.Duration
		reason := strings.ReplaceAll(r.Reason, "\n", " ")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.ToUpper(string(r.Status)), r.ID, r.Duration.Round(time.Millisecond), r.Spec, reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := Summarize(results)
	_, err := fmt.Fprintf(w, "\n%d checks\nconformance: %d passed, %d failed, %d skipped\n", len(results), s.Pass, s.Fail, s.Skip)
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
