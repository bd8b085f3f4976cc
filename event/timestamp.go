package event

import "time"

// appendTimestamp appends t as t.AppendFormat(b, time.RFC3339Nano) does.
// Every stored event's time is in UTC, and for those it writes the digits
// itself: time's formatter, general over layouts and zones, was 6% of a
// catch-up's CPU. Other zones, and years outside 0-9999, go to time.
func appendTimestamp(b []byte, t time.Time) []byte {
	if t.Location() != time.UTC {
		return t.AppendFormat(b, time.RFC3339Nano)
	}
	const secondsPerDay = 86400
	sec := t.Unix()
	days := sec / secondsPerDay
	if sec%secondsPerDay < 0 {
		days--
	}
	clock := sec - days*secondsPerDay
	year, month, day := civil(days)
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, time.RFC3339Nano)
	}
	b = append(b, digits2[year/100*2], digits2[year/100*2+1], digits2[year%100*2], digits2[year%100*2+1], '-')
	b = append(b, digits2[month*2], digits2[month*2+1], '-', digits2[day*2], digits2[day*2+1], 'T')
	h, m, s := clock/3600, clock/60%60, clock%60
	b = append(b, digits2[h*2], digits2[h*2+1], ':', digits2[m*2], digits2[m*2+1], ':', digits2[s*2], digits2[s*2+1])
	if ns := t.Nanosecond(); ns != 0 {
		// Nine digits, then the trailing zeros dropped, as RFC3339Nano's
		// ".999999999" does.
		var frac [10]byte
		frac[0] = '.'
		for i := 9; i > 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := 10
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	return append(b, 'Z')
}

// civil is the proleptic Gregorian date of a day counted from 1970-01-01
// (Howard Hinnant's days_from_civil, inverted).
func civil(days int64) (year, month, day int64) {
	z := days + 719468
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097                                  // [0, 146096]
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // [0, 399]
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // [0, 365]
	mp := (5*doy + 2) / 153                                // [0, 11], March first
	day = doy - (153*mp+2)/5 + 1
	month = mp + 3
	if month > 12 {
		month -= 12
	}
	year = yoe + era*400
	if month <= 2 {
		year++
	}
	return year, month, day
}

// digits2 holds the two digits of 0 to 99, each at twice its value.
const digits2 = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"
