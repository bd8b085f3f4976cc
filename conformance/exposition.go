package conformance

import (
	"fmt"
	"strconv"
	"strings"
)

// checkExposition validates a Prometheus text exposition (format 0.0.4):
// HELP and TYPE comments, then samples `name{label="value",...} value
// [timestamp]`. It returns "" when the body is valid and holds at least one
// sample, else what is wrong.
func checkExposition(body string) string {
	samples := 0
	for n, line := range strings.Split(body, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		where := fmt.Sprintf("line %d %q", n+1, clip(line))
		if strings.HasPrefix(line, "#") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 2 && f[1] == "TYPE":
				if len(f) != 4 || !isMetricName(f[2]) {
					return where + ": malformed TYPE line"
				}
				switch f[3] {
				case "counter", "gauge", "histogram", "summary", "untyped", "unknown", "gaugehistogram", "info", "stateset":
				default:
					return where + ": unknown metric type " + f[3]
				}
			case len(f) >= 2 && f[1] == "HELP":
				if len(f) < 3 || !isMetricName(f[2]) {
					return where + ": malformed HELP line"
				}
			}
			continue
		}
		if msg := checkSample(line); msg != "" {
			return where + ": " + msg
		}
		samples++
	}
	if samples == 0 {
		return "no samples"
	}
	return ""
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// checkSample validates one sample line.
func checkSample(line string) string {
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return "no value"
	}
	if !isMetricName(line[:i]) {
		return "bad metric name " + strconv.Quote(line[:i])
	}
	rest := line[i:]
	if rest[0] == '{' {
		end, msg := scanLabels(rest)
		if msg != "" {
			return msg
		}
		rest = rest[end:]
	}
	f := strings.Fields(rest)
	if len(f) < 1 || len(f) > 2 {
		return "want a value and an optional timestamp"
	}
	if _, err := strconv.ParseFloat(f[0], 64); err != nil {
		return "bad value " + strconv.Quote(f[0])
	}
	if len(f) == 2 {
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			return "bad timestamp " + strconv.Quote(f[1])
		}
	}
	return ""
}

// scanLabels checks a label set starting at s[0] == '{' and returns the
// index just past its closing brace.
func scanLabels(s string) (int, string) {
	i := 1
	for {
		if i >= len(s) {
			return 0, "unterminated label set"
		}
		if s[i] == '}' {
			return i + 1, ""
		}
		j := i
		for j < len(s) && (s[j] == '_' || isAlpha(s[j]) || (j > i && isDigit(s[j]))) {
			j++
		}
		if j == i || j+1 >= len(s) || s[j] != '=' || s[j+1] != '"' {
			return 0, "malformed label at " + strconv.Quote(clip(s[i:]))
		}
		j += 2
		for {
			if j >= len(s) {
				return 0, "unterminated label value"
			}
			if s[j] == '\\' {
				j += 2
				continue
			}
			if s[j] == '"' {
				break
			}
			j++
		}
		i = j + 1
		if i < len(s) && s[i] == ',' {
			i++
		}
	}
}

func isMetricName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || c == ':' || isAlpha(c) || (i > 0 && isDigit(c)) {
			continue
		}
		return false
	}
	return true
}

func isAlpha(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
