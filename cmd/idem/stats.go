package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"github.com/idemkit/idem"
)

var statsCommand = &command{
	name:    "stats",
	args:    "[--json]",
	summary: "count operations by state and scope; oldest unsettled; size on disk",
	help: `
Prints the number of operations by state and by scope, the age of the
oldest operation not yet settled (pending, in_flight, unknown or expired),
and the journal's size on disk: the file and its -wal.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var asJSON bool
		fs.BoolVar(&asJSON, "json", false, "print one JSON object")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("stats", args); err != nil {
				return err
			}
			return withJournal(e, func(j *idem.SQLiteJournal) error {
				counts, err := j.Count(ctx)
				if err != nil {
					return err
				}
				s, err := newStats(j.Path(), counts, e.now())
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(e.stdout, s)
				}
				return s.print(e)
			})
		}
	},
}

type stats struct {
	Journal   string `json:"journal"`
	SizeBytes int64  `json:"size_bytes"`
	FileBytes int64  `json:"file_bytes"`
	WALBytes  int64  `json:"wal_bytes"`
	Total     int    `json:"total"`
	// ByState has every state, zero or not.
	ByState map[string]int `json:"by_state"`
	ByScope []scopeCount   `json:"by_scope"`
	// OldestUnsettled is the oldest operation that is not settled
	// (pending, in_flight, unknown, expired), or nil.
	OldestUnsettled *oldest `json:"oldest_unsettled"`
}

type scopeCount struct {
	Scope   string         `json:"scope"`
	Total   int            `json:"total"`
	ByState map[string]int `json:"by_state"`
}

type oldest struct {
	Scope      string    `json:"scope"`
	State      string    `json:"state"`
	CreatedAt  time.Time `json:"created_at"`
	AgeSeconds int64     `json:"age_seconds"`
}

func newStats(path string, counts []idem.Count, now time.Time) (stats, error) {
	s := stats{Journal: path, ByState: map[string]int{}, ByScope: []scopeCount{}}
	var err error
	if s.FileBytes, err = fileSize(path); err != nil {
		return stats{}, err
	}
	if s.WALBytes, err = fileSize(path + "-wal"); err != nil {
		return stats{}, err
	}
	s.SizeBytes = s.FileBytes + s.WALBytes
	for _, st := range idem.States() {
		s.ByState[st.String()] = 0
	}
	for _, c := range counts { // ordered by scope, then state
		s.Total += c.N
		s.ByState[c.State.String()] += c.N
		if len(s.ByScope) == 0 || s.ByScope[len(s.ByScope)-1].Scope != c.Scope {
			s.ByScope = append(s.ByScope, scopeCount{Scope: c.Scope, ByState: map[string]int{}})
		}
		sc := &s.ByScope[len(s.ByScope)-1]
		sc.Total += c.N
		sc.ByState[c.State.String()] += c.N
		if !c.State.Terminal() && (s.OldestUnsettled == nil || c.Oldest.Before(s.OldestUnsettled.CreatedAt)) {
			s.OldestUnsettled = &oldest{Scope: c.Scope, State: c.State.String(), CreatedAt: c.Oldest.UTC(),
				AgeSeconds: int64(max(now.Sub(c.Oldest), 0) / time.Second)}
		}
	}
	return s, nil
}

// fileSize is the size of the file at path, zero when it does not exist.
func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (s stats) print(e *env) error {
	w := e.stdout
	tw := newTable(w)
	row(tw, "journal", s.Journal)
	row(tw, "size", fmt.Sprintf("%s (file %s, wal %s)", formatBytes(s.SizeBytes), formatBytes(s.FileBytes), formatBytes(s.WALBytes)))
	row(tw, "operations", strconv.Itoa(s.Total))
	oldestLine := "none"
	if o := s.OldestUnsettled; o != nil {
		oldestLine = fmt.Sprintf("%s old (%s, scope %s, created %s)", formatAge(time.Duration(o.AgeSeconds)*time.Second),
			o.State, o.Scope, o.CreatedAt.Format("2006-01-02 15:04:05.000Z07:00"))
	}
	row(tw, "oldest unsettled", oldestLine)
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nby state:")
	tw = newTable(w)
	for _, st := range idem.States() {
		row(tw, "  "+st.String(), strconv.Itoa(s.ByState[st.String()]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nby scope:")
	if len(s.ByScope) == 0 {
		fmt.Fprintln(w, "  (none)")
		return nil
	}
	tw = newTable(w)
	head := []string{"  SCOPE", "TOTAL"}
	for _, st := range idem.States() {
		head = append(head, st.String())
	}
	row(tw, head...)
	for _, sc := range s.ByScope {
		cells := []string{"  " + sc.Scope, strconv.Itoa(sc.Total)}
		for _, st := range idem.States() {
			cells = append(cells, strconv.Itoa(sc.ByState[st.String()]))
		}
		row(tw, cells...)
	}
	return tw.Flush()
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[i])
}
