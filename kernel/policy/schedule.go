package policy

import (
	"fmt"
	"strings"
	"time"
	// Embedded so schedules load the same on minimal hosts and containers
	// that ship no tz database.
	_ "time/tzdata"
)

// schedule is a compiled `when.schedule`: a weekly time window in a zone.
type schedule struct {
	days       [7]bool // indexed by time.Weekday
	start, end int     // minutes since midnight; end < start wraps midnight
	loc        *time.Location
}

func parseSchedule(s string) (*schedule, error) {
	fields := strings.Fields(s)
	if len(fields) != 2 && len(fields) != 3 {
		return nil, fmt.Errorf("schedule %q: want \"<days> <HH:MM-HH:MM> [zone]\"", s)
	}
	sc := &schedule{loc: time.UTC}
	if err := sc.parseDays(fields[0]); err != nil {
		return nil, fmt.Errorf("schedule %q: %w", s, err)
	}
	if err := sc.parseWindow(fields[1]); err != nil {
		return nil, fmt.Errorf("schedule %q: %w", s, err)
	}
	if len(fields) == 3 {
		// "Local" would make the policy depend on the host's zone.
		if fields[2] == "Local" {
			return nil, fmt.Errorf("schedule %q: zone must be an IANA name, not Local", s)
		}
		loc, err := time.LoadLocation(fields[2])
		if err != nil {
			return nil, fmt.Errorf("schedule %q: zone: %w", s, err)
		}
		sc.loc = loc
	}
	return sc, nil
}

func (sc *schedule) parseDays(spec string) error {
	for item := range strings.SplitSeq(spec, ",") {
		first, last, isRange := strings.Cut(item, "-")
		from, err := parseWeekday(first)
		if err != nil {
			return err
		}
		to := from
		if isRange {
			if to, err = parseWeekday(last); err != nil {
				return err
			}
		}
		for d := from; ; d = (d + 1) % 7 {
			sc.days[d] = true
			if d == to {
				break
			}
		}
	}
	return nil
}

func parseWeekday(s string) (time.Weekday, error) {
	for d := time.Sunday; d <= time.Saturday; d++ {
		if strings.EqualFold(s, d.String()[:3]) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown day %q (want Sun, Mon, Tue, Wed, Thu, Fri or Sat)", s)
}

func (sc *schedule) parseWindow(spec string) error {
	from, to, ok := strings.Cut(spec, "-")
	if !ok {
		return fmt.Errorf("time window %q: want HH:MM-HH:MM", spec)
	}
	var err error
	if sc.start, err = parseClock(from, false); err != nil {
		return err
	}
	if sc.end, err = parseClock(to, true); err != nil {
		return err
	}
	if sc.start == sc.end {
		return fmt.Errorf("time window %q is empty", spec)
	}
	return nil
}

// parseClock parses HH:MM into minutes since midnight. "24:00" is accepted
// as an end so a window can run to the end of the day without wrapping.
func parseClock(s string, isEnd bool) (int, error) {
	h, m, ok := twoDigits(s, 0), twoDigits(s, 3), len(s) == 5 && s[2] == ':'
	switch {
	case ok && h >= 0 && h < 24 && m >= 0 && m < 60:
		return h*60 + m, nil
	case ok && isEnd && h == 24 && m == 0:
		return 24 * 60, nil
	}
	return 0, fmt.Errorf("time %q: want HH:MM between 00:00 and 23:59", s)
}

// twoDigits returns the decimal value of s[i:i+2], or -1 if those are not
// two ASCII digits.
func twoDigits(s string, i int) int {
	if i+2 > len(s) || s[i] < '0' || s[i] > '9' || s[i+1] < '0' || s[i+1] > '9' {
		return -1
	}
	return int(s[i]-'0')*10 + int(s[i+1]-'0')
}

// contains reports whether t falls in the window. For a window wrapping
// midnight the part after midnight belongs to the previous day, so
// "Fri 22:00-02:00" keeps running into Saturday morning.
func (sc *schedule) contains(t time.Time) bool {
	local := t.In(sc.loc)
	minute := local.Hour()*60 + local.Minute()
	day := local.Weekday()
	if sc.start < sc.end {
		return sc.days[day] && minute >= sc.start && minute < sc.end
	}
	if minute >= sc.start {
		return sc.days[day]
	}
	return minute < sc.end && sc.days[(day+6)%7]
}
