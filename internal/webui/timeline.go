package webui

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

// A timeline is the picture of an operation's history: a band of its
// states over time, its attempts and waits as boxes, its status checks
// and other events as marks, each with a tooltip (an SVG title) saying
// when and why. Time runs left to right, but each gap between events is
// drawn on a log scale, so that a 2 ms attempt and a 2 h wait both show.
type timeline struct {
	Width, Height float64
	Lanes         []tlLane
	Boxes         []tlBox
	Marks         []tlMark
	Ticks         []tlTick
}

type tlLane struct {
	Y     float64
	Label string
}

type tlBox struct {
	X, Y, W, H float64
	// Class styles it: state-<state>, attempt, wait.
	Class string
	// Label is drawn in the box when it fits; Title is the tooltip.
	Label, Title string
}

type tlMark struct {
	X, Y  float64
	Class string // status, status-failed, event
	Label string
	Title string
}

type tlTick struct {
	X     float64
	Label string
}

// Geometry of the picture, in SVG user units (pixels).
const (
	tlLeft     = 110.0 // the lanes' labels
	tlRight    = 60.0
	tlTop      = 8.0
	tlLaneH    = 26.0
	tlBoxH     = 18.0
	tlMinGap   = 36.0 // events at the same millisecond
	tlGapPerLn = 20.0 // per e-fold of the gap in milliseconds
	tlEndCap   = 70.0 // the settled state after the last event
)

// Lanes, top to bottom.
const (
	laneState = iota
	laneAttempts
	laneWaits
	laneStatus
	laneEvents
	laneCount
)

var laneNames = [laneCount]string{"state", "attempts", "waits", "status checks", "events"}

// waitedRe finds the wait the client reports in a send event's detail
// ("retry, same key: HTTP 503; waited 1s (the server's Retry-After)"):
// the wait ended with the send.
var waitedRe = regexp.MustCompile(`waited ([0-9][0-9a-zµ.]*)`)

// newTimeline lays out hist, the history of rec, at now: an operation
// not yet settled goes on to now.
func newTimeline(rec idem.Record, hist []idem.Event, now time.Time) *timeline {
	if len(hist) == 0 {
		return nil
	}
	times := make([]time.Time, 0, len(hist)+1)
	for _, ev := range hist {
		times = append(times, ev.At)
	}
	open := !rec.State.Terminal() && rec.State != idem.StateExpired
	if last := hist[len(hist)-1].At; open && now.After(last) {
		times = append(times, now)
	}
	xs := make([]float64, len(times))
	xs[0] = tlLeft
	for i := 1; i < len(times); i++ {
		gap := max(times[i].Sub(times[i-1]), 0)
		xs[i] = xs[i-1] + tlMinGap + tlGapPerLn*math.Log1p(float64(gap)/float64(time.Millisecond))
	}
	// at places a time within the segment that contains it, linearly.
	at := func(t time.Time) float64 {
		for i := 1; i < len(times); i++ {
			if !t.After(times[i]) {
				span := times[i].Sub(times[i-1])
				if span <= 0 {
					return xs[i]
				}
				f := float64(t.Sub(times[i-1])) / float64(span)
				return xs[i-1] + max(f, 0)*(xs[i]-xs[i-1])
			}
		}
		return xs[len(xs)-1]
	}
	tl := &timeline{Width: xs[len(xs)-1] + tlRight, Height: tlTop + laneCount*tlLaneH + 24}
	laneY := func(l int) float64 { return tlTop + float64(l)*tlLaneH }
	for l, name := range laneNames {
		tl.Lanes = append(tl.Lanes, tlLane{Y: laneY(l) + tlBoxH/2 + 4, Label: name})
	}
	box := func(lane int, x0, x1 float64, class, label, title string) {
		w := max(x1-x0, 3)
		if !fits(label, w) {
			label = ""
		}
		tl.Boxes = append(tl.Boxes, tlBox{X: x0, Y: laneY(lane), W: w, H: tlBoxH, Class: class, Label: label, Title: title})
	}
	stamp := func(t time.Time) string { return t.UTC().Format(operator.TimeLayout) }

	prevError := ""
	// waitOpen is the index in tl.Boxes of the wait the last event left
	// open, -1 when none; waitFrom is when it began.
	waitOpen, waitFrom := -1, time.Time{}
	for i, ev := range hist {
		end, endT := xs[len(xs)-1], times[len(times)-1]
		if i+1 < len(times) {
			end, endT = xs[i+1], times[i+1]
		}
		why := operator.EventWhy(ev, prevError)
		prevError = ev.Error
		title := fmt.Sprintf("v%d %s %s, %s", ev.Version, stamp(ev.At), ev.Kind, operator.StateChange(ev))
		if why != "" {
			title += ": " + why
		}

		// The state from this event to the next.
		if i+1 < len(times) {
			box(laneState, xs[i], end, "state-"+ev.To.String(), ev.To.String(),
				fmt.Sprintf("%s from %s for %s", ev.To, stamp(ev.At), span(endT.Sub(ev.At))))
		}
		// What the operation did meanwhile: an attempt on the wire, or a
		// wait for the next attempt or status check.
		waiting := false
		if i+1 < len(times) {
			switch ev.To {
			case idem.StateInFlight:
				res, stop, stopT := "no answer recorded", end, endT
				if i+1 < len(hist) {
					res = answerOf(hist[i+1])
					// The attempt ended where the wait before the next
					// send began.
					if d := waitBefore(hist[i+1]); d > 0 && hist[i+1].At.Add(-d).After(ev.At) {
						stopT = hist[i+1].At.Add(-d)
						stop = at(stopT)
					}
				}
				box(laneAttempts, xs[i], stop, "attempt", fmt.Sprintf("attempt %d", ev.Attempt),
					fmt.Sprintf("attempt %d from %s, %s: %s", ev.Attempt, stamp(ev.At), span(stopT.Sub(ev.At)), res))
			case idem.StatePending, idem.StateUnknown:
				// One wait from the move into the state to the next
				// attempt, however many status checks and stops it holds.
				from, fromX := ev.At, xs[i]
				if waitOpen >= 0 && ev.From == ev.To {
					from, fromX = waitFrom, tl.Boxes[waitOpen].X
					tl.Boxes = slices.Delete(tl.Boxes, waitOpen, waitOpen+1)
				}
				waitOpen, waitFrom = len(tl.Boxes), from
				box(laneWaits, fromX, end, "wait", "wait "+span(endT.Sub(from)),
					fmt.Sprintf("%s from %s for %s, then %s", ev.To, stamp(from), span(endT.Sub(from)), nextOf(hist, i, rec)))
				waiting = true
			}
		}
		if !waiting {
			waitOpen = -1
		}
		// A wait the client reports inside an attempt's span: it ended
		// with this send.
		if d := waitBefore(ev); d > 0 && i > 0 {
			from := at(ev.At.Add(-d))
			box(laneWaits, max(from, xs[i-1]), xs[i], "wait", "wait "+span(d), "waited "+span(d)+" before attempt "+
				strconv.Itoa(ev.Attempt)+": "+ev.Detail)
		}
		// Marks.
		switch ev.Kind {
		case idem.EventStatus:
			class, label := "status", "✓"
			if ev.From == ev.To {
				class, label = "status-failed", "?"
			}
			if ev.StatusCode != 0 {
				label = strconv.Itoa(ev.StatusCode)
			}
			tl.Marks = append(tl.Marks, tlMark{X: xs[i], Y: laneY(laneStatus) + tlBoxH/2, Class: class, Label: label, Title: title})
		default:
			tl.Marks = append(tl.Marks, tlMark{X: xs[i], Y: laneY(laneEvents) + tlBoxH/2, Class: "event event-" + ev.Kind.String(),
				Label: ev.Kind.String(), Title: title})
		}
	}
	// A settled operation ends in its state, drawn as a cap.
	if !open {
		last := hist[len(hist)-1]
		box(laneState, xs[len(xs)-1], xs[len(xs)-1]+tlEndCap, "state-"+last.To.String(), last.To.String(),
			fmt.Sprintf("%s since %s", last.To, stamp(last.At)))
		tl.Width += tlEndCap
	}
	// A mark's label shows when it fits before the next mark of its lane.
	for i := range tl.Marks {
		for j := i + 1; j < len(tl.Marks); j++ {
			if tl.Marks[j].Y == tl.Marks[i].Y {
				if !fits(tl.Marks[i].Label, tl.Marks[j].X-tl.Marks[i].X-8) {
					tl.Marks[i].Label = ""
				}
				break
			}
		}
	}
	// Ticks: the first event's time, and the time since it of the last.
	y0 := hist[0].At
	tl.Ticks = append(tl.Ticks, tlTick{X: xs[0], Label: stamp(y0)})
	if len(times) > 1 {
		label := "+" + span(times[len(times)-1].Sub(y0))
		if len(times) > len(hist) {
			label += " (now)"
		}
		tl.Ticks = append(tl.Ticks, tlTick{X: xs[len(xs)-1], Label: label})
	}
	return tl
}

// waitBefore is the wait the client reports in a send event's detail,
// which ended with the send; zero when it reports none.
func waitBefore(ev idem.Event) time.Duration {
	if ev.Kind != idem.EventSend {
		return 0
	}
	m := waitedRe.FindStringSubmatch(ev.Detail)
	if m == nil {
		return 0
	}
	d, err := time.ParseDuration(m[1])
	if err != nil || d < 0 {
		return 0
	}
	return d
}

// fits reports whether label fits in a box w wide, at about 6.5 units a
// character.
func fits(label string, w float64) bool {
	return float64(len([]rune(label)))*6.5+6 <= w
}

// span prints a duration short: 850ms, 1.2s, 5m03s, 3h07m.
func span(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	}
	return operator.FormatAge(d)
}

// answerOf says what the event after an attempt's start recorded.
func answerOf(next idem.Event) string {
	switch {
	case next.StatusCode != 0:
		return fmt.Sprintf("HTTP %d, %s", next.StatusCode, next.To)
	case next.Kind == idem.EventSend:
		return "sent again: " + next.Detail
	case next.Error != "":
		return next.To.String() + ": " + next.Error
	}
	return next.Kind.String() + ", " + next.To.String()
}

// nextOf says what ended a wait that started with hist[i].
func nextOf(hist []idem.Event, i int, rec idem.Record) string {
	if i+1 < len(hist) {
		return hist[i+1].Kind.String()
	}
	if !rec.NextAttemptAt.IsZero() {
		return "due again at " + rec.NextAttemptAt.UTC().Format(operator.TimeLayout)
	}
	return "still waiting"
}
