package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestClockOffsetIsMeasuredOnlyWhereItShows: a reading of the server's
// clock moves times by the offset it shows, unless the offset is within
// the reading's error, and a later reading changes it only when the clock
// was stepped or the reading is much more precise, so that times read back
// come back as they were given.
func TestClockOffsetIsMeasuredOnlyWhereItShows(t *testing.T) {
	t.Parallel()
	base := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := time.Millisecond
	c := newDBClock()
	c.observe(base, base.Add(40*ms), base.Add(35*ms))
	assert.Zero(t, c.off(), "15 ms off, within the 20 ms a reading of a 40 ms round trip can tell: the clocks agree")

	c = newDBClock()
	c.observe(base, base.Add(10*ms), base.Add(time.Hour+5*ms))
	assert.Equal(t, time.Hour, c.off(), "an hour ahead")
	c.observe(base, base.Add(8*ms), base.Add(time.Hour+6*ms))
	assert.Equal(t, time.Hour, c.off(), "a reading about as precise, within both errors: kept, so that times come back as given")
	c.observe(base, base.Add(2*ms), base.Add(time.Hour+ms+500*time.Microsecond))
	assert.Equal(t, time.Hour+500*time.Microsecond, c.off(), "a reading four times as precise replaces it")
	c.observe(base, base.Add(2*ms), base.Add(2*time.Hour+ms))
	assert.Equal(t, 2*time.Hour, c.off(), "a clock stepped by an hour is followed")
}
