package policy

import (
	"strings"
	"testing"
	"time"
)

func TestScheduleContains(t *testing.T) {
	// 2025-01-06 is a Monday.
	at := func(day, hour, minute int) time.Time {
		return time.Date(2025, time.January, 5+day, hour, minute, 0, 0, time.UTC)
	}
	const sun, mon, tue, wed, thu, fri, sat = 0, 1, 2, 3, 4, 5, 6
	tests := []struct {
		schedule string
		now      time.Time
		want     bool
	}{
		{"Mon-Fri 09:00-17:00 UTC", at(mon, 9, 0), true},
		{"Mon-Fri 09:00-17:00 UTC", at(mon, 8, 59), false},
		{"Mon-Fri 09:00-17:00 UTC", at(fri, 16, 59).Add(59 * time.Second), true},
		{"Mon-Fri 09:00-17:00 UTC", at(fri, 17, 0), false},
		{"Mon-Fri 09:00-17:00 UTC", at(sat, 10, 0), false},
		{"Mon-Fri 09:00-17:00 UTC", at(sun, 10, 0), false},

		// Day ranges may wrap the week.
		{"Fri-Mon 10:00-12:00 UTC", at(fri, 11, 0), true},
		{"Fri-Mon 10:00-12:00 UTC", at(sat, 11, 0), true},
		{"Fri-Mon 10:00-12:00 UTC", at(sun, 11, 0), true},
		{"Fri-Mon 10:00-12:00 UTC", at(mon, 11, 0), true},
		{"Fri-Mon 10:00-12:00 UTC", at(tue, 11, 0), false},
		{"Fri-Mon 10:00-12:00 UTC", at(thu, 11, 0), false},

		// Comma lists, case-insensitive names, ranges inside lists, UTC by default.
		{"Mon,Wed,Fri 10:00-12:00", at(wed, 11, 0), true},
		{"Mon,Wed,Fri 10:00-12:00", at(tue, 11, 0), false},
		{"mon,WED 10:00-12:00", at(wed, 11, 0), true},
		{"Mon-Tue,Sat 10:00-12:00", at(sat, 11, 0), true},
		{"Mon-Tue,Sat 10:00-12:00", at(wed, 11, 0), false},

		// A window wrapping midnight belongs to the day it starts on.
		{"Fri 22:00-02:00 UTC", at(fri, 23, 0), true},
		{"Fri 22:00-02:00 UTC", at(sat, 1, 59), true},
		{"Fri 22:00-02:00 UTC", at(sat, 2, 0), false},
		{"Fri 22:00-02:00 UTC", at(fri, 1, 0), false},
		{"Fri 22:00-02:00 UTC", at(sat, 22, 30), false},
		{"Sat-Sun 22:00-06:00 UTC", at(mon, 5, 0), true},
		{"Sat-Sun 22:00-06:00 UTC", at(sat, 5, 0), false},

		{"Sat 00:00-24:00 UTC", at(sat, 23, 59), true},
		{"Sat 00:00-24:00 UTC", at(sun, 0, 0), false},

		// 14:00 UTC is 09:00 in New York in January (EST, UTC-5).
		{"Mon-Fri 09:00-17:00 America/New_York", at(mon, 14, 0), true},
		{"Mon-Fri 09:00-17:00 America/New_York", at(mon, 13, 59), false},
		{"Mon-Fri 09:00-17:00 America/New_York", at(mon, 21, 59), true},
		{"Mon-Fri 09:00-17:00 America/New_York", at(mon, 22, 0), false},
		// Saturday 03:00 UTC is still Friday evening in New York.
		{"Fri 20:00-23:00 America/New_York", at(sat, 3, 0), true},
		{"Sat 20:00-23:00 America/New_York", at(sat, 3, 0), false},
		// The zone of Now does not matter, only the instant.
		{"Mon 10:00-11:00 UTC", at(mon, 10, 30).In(time.FixedZone("X", 9*3600)), true},
	}
	for _, tt := range tests {
		t.Run(tt.schedule+"@"+tt.now.Format(time.RFC3339), func(t *testing.T) {
			sc, err := parseSchedule(tt.schedule)
			if err != nil {
				t.Fatal(err)
			}
			if got := sc.contains(tt.now); got != tt.want {
				t.Errorf("contains = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestScheduleErrors(t *testing.T) {
	tests := []struct {
		schedule string
		want     string
	}{
		{"Mon-Fri", "want \"<days> <HH:MM-HH:MM> [zone]\""},
		{"Mon-Fri 09:00-17:00 UTC extra", "want \"<days>"},
		{"Funday 09:00-10:00 UTC", `unknown day "Funday"`},
		{"Mon-Someday 09:00-10:00", `unknown day "Someday"`},
		{"Mon,,Tue 09:00-10:00", `unknown day ""`},
		{"Monday 09:00-10:00", `unknown day "Monday"`},
		{"Mon 09:00 UTC", "want HH:MM-HH:MM"},
		{"Mon 9:00-17:00 UTC", `time "9:00"`},
		{"Mon 09:00-17:60 UTC", `time "17:60"`},
		{"Mon 25:00-26:00 UTC", `time "25:00"`},
		{"Mon 24:00-02:00 UTC", `time "24:00"`},
		{"Mon +9:00-10:00 UTC", `time "+9:00"`},
		{"Mon 10:00-10:00 UTC", "is empty"},
		{"Mon 09:00-17:00 Mars/Olympus", "zone"},
		{"Mon 09:00-17:00 Local", "not Local"},
	}
	for _, tt := range tests {
		t.Run(tt.schedule, func(t *testing.T) {
			_, err := parseSchedule(tt.schedule)
			if err == nil {
				t.Fatal("parseSchedule succeeded, want error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}
